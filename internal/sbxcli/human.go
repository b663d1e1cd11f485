package sbxcli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/quantity"
)

// Human units for text output (-o json keeps the API's raw values).

// humanBytes renders a byte count in binary units: "512 B", "1.9 GiB", "128 MiB".
func humanBytes(b int64) string {
	const units = "KMGTPE"
	if b < 1024 {
		return strconv.FormatInt(b, 10) + " B"
	}
	v, i := float64(b)/1024, 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	if v >= 10 {
		s = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.TrimSuffix(s, ".0") + " " + units[i:i+1] + "iB"
}

// humanMemory renders a Kubernetes memory quantity ("2Gi", "500M") in binary units; a
// value it cannot parse is shown as it is.
func humanMemory(q string) string {
	b, err := quantity.ParseMemory(q)
	if err != nil {
		return q
	}
	return humanBytes(b)
}

// humanMilliCPU renders millicores: "500m CPU", "2 CPU", "1.5 CPU".
func humanMilliCPU(m int64) string {
	switch {
	case m < 1000:
		return fmt.Sprintf("%dm CPU", m)
	case m%1000 == 0:
		return fmt.Sprintf("%d CPU", m/1000)
	}
	return strings.TrimRight(strconv.FormatFloat(float64(m)/1000, 'f', 3, 64), "0") + " CPU"
}

// humanCPU renders a Kubernetes CPU quantity ("500m", "2"); a value it cannot parse is
// shown as it is.
func humanCPU(q string) string {
	m, err := quantity.ParseCPU(q)
	if err != nil {
		return q
	}
	return humanMilliCPU(m)
}

// humanDuration renders d to the second without zero tails: "9m12s", "10m", "1h",
// "3d4h" from two days on.
func humanDuration(d time.Duration) string {
	d = d.Round(time.Second)
	if d >= 48*time.Hour {
		days, rest := d/(24*time.Hour), d%(24*time.Hour)
		s := fmt.Sprintf("%dd", days)
		if h := rest / time.Hour; h > 0 {
			s += fmt.Sprintf("%dh", h)
		}
		return s
	}
	s := d.String()
	if len(s) > 2 && strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if len(s) > 2 && strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// localTime renders t in local time to the second: "2026-01-02 15:04:05 CET".
func localTime(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05 MST") }

// humanTime renders t in local time with how far away it is: "2026-01-02 15:04:05 CET
// (in 9m12s)", "… (3m ago)".
func humanTime(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	s := localTime(t)
	// Whole seconds, cut down: time left is never overstated (19m59.6s left is "19m59s",
	// not "20m").
	if d := t.Sub(now); d >= 0 {
		return s + " (in " + humanDuration(d.Truncate(time.Second)) + ")"
	}
	return s + " (" + humanDuration(now.Sub(t).Truncate(time.Second)) + " ago)"
}
