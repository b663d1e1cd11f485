package gateway

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// parseCPU parses a Kubernetes CPU quantity ("500m", "2", "1.5") into millicores.
func parseCPU(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	if v, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("invalid CPU quantity %q: want e.g. 500m or 2", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > 1e9 {
		return 0, fmt.Errorf("invalid CPU quantity %q: want e.g. 500m or 2", s)
	}
	return int64(math.Round(f * 1000)), nil
}

var memorySuffixes = []struct {
	suffix string
	mult   float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// parseMemory parses a Kubernetes memory quantity ("512Mi", "1Gi", "1G", "1048576") into
// bytes.
func parseMemory(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	mult := 1.0
	num := s
	for _, m := range memorySuffixes {
		if v, ok := strings.CutSuffix(s, m.suffix); ok {
			num, mult = v, m.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("invalid memory quantity %q: want e.g. 512Mi or 1Gi", s)
	}
	return int64(math.Round(f * mult)), nil
}

// formatCPU renders millicores the way Kubernetes does: whole cores without a suffix.
func formatCPU(milli int64) string {
	if milli%1000 == 0 {
		return strconv.FormatInt(milli/1000, 10)
	}
	return strconv.FormatInt(milli, 10) + "m"
}

// formatMemory renders bytes with the largest binary suffix that divides them.
func formatMemory(b int64) string {
	for _, s := range []struct {
		suffix string
		mult   int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b >= s.mult && b%s.mult == 0 {
			return strconv.FormatInt(b/s.mult, 10) + s.suffix
		}
	}
	return strconv.FormatInt(b, 10)
}
