// Package quantity parses and formats the Kubernetes-style resource quantities of the
// sandbox API: CPU as cores or millicores ("2", "1.5", "500m") and memory as bytes with
// an optional decimal or binary suffix ("1G", "512Mi", "1.5Gi", "1048576").
//
// Parsing is exact (no floating point): a plain decimal number, optionally followed by
// one suffix. Signs, exponents, hex, "Inf" and "NaN" are refused. A value finer than the
// unit (a fraction of a millicore or of a byte) is rounded up, as Kubernetes does.
package quantity

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// Max is the largest value either parser returns (2^62): big enough for any machine,
// small enough that sums of a few thousand quantities cannot overflow int64.
const Max = int64(1) << 62

// ParseCPU parses a CPU quantity into millicores. The empty string is 0.
func ParseCPU(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	num, scale := s, int64(1000)
	if v, ok := strings.CutSuffix(s, "m"); ok {
		num, scale = v, 1
	}
	n, ok := decimal(num, scale)
	if !ok {
		return 0, fmt.Errorf("invalid CPU quantity %q: want cores or millicores, e.g. 2, 1.5 or 500m", s)
	}
	return n, nil
}

var memorySuffixes = map[string]int64{
	"":   1,
	"k":  1e3,
	"K":  1e3,
	"M":  1e6,
	"G":  1e9,
	"T":  1e12,
	"P":  1e15,
	"E":  1e18,
	"Ki": 1 << 10,
	"Mi": 1 << 20,
	"Gi": 1 << 30,
	"Ti": 1 << 40,
	"Pi": 1 << 50,
	"Ei": 1 << 60,
}

// ParseMemory parses a memory quantity into bytes. The empty string is 0.
func ParseMemory(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	i := len(s)
	for i > 0 && (s[i-1] < '0' || s[i-1] > '9') && s[i-1] != '.' {
		i--
	}
	mult, known := memorySuffixes[s[i:]]
	n, ok := decimal(s[:i], mult)
	if !known || !ok {
		return 0, fmt.Errorf("invalid memory quantity %q: want bytes with an optional suffix, e.g. 512Mi, 4Gi or 1G", s)
	}
	return n, nil
}

// decimal parses digits[.digits] times mult, rounding up to a whole number; ok is false
// for anything else or a result above Max.
func decimal(s string, mult int64) (int64, bool) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" && frac == "" || dot && frac == "" || len(whole)+len(frac) > 40 || !digits(whole) || !digits(frac) {
		return 0, false
	}
	num, ok := new(big.Int).SetString(whole+frac, 10)
	if !ok {
		return 0, false
	}
	num.Mul(num, big.NewInt(mult))
	den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() || q.Int64() > Max {
		return 0, false
	}
	return q.Int64(), true
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// FormatCPU renders millicores the way Kubernetes does: whole cores without a suffix,
// anything else in millicores ("2", "500m", "1500m").
func FormatCPU(milli int64) string {
	if milli%1000 == 0 {
		return strconv.FormatInt(milli/1000, 10)
	}
	return strconv.FormatInt(milli, 10) + "m"
}

// FormatMemory renders bytes with the largest binary suffix that divides them exactly
// ("512Mi", "1Gi"), else as plain bytes.
func FormatMemory(b int64) string {
	for _, s := range []struct {
		suffix string
		mult   int64
	}{{"Ei", 1 << 60}, {"Pi", 1 << 50}, {"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b >= s.mult && b%s.mult == 0 {
			return strconv.FormatInt(b/s.mult, 10) + s.suffix
		}
	}
	return strconv.FormatInt(b, 10)
}
