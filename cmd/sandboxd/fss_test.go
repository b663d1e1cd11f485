package main

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/gateway"
)

// TestFSSFlags: the defaults are the documented limits, flags reach the options, and bad
// values are refused naming the flag.
func TestFSSFlags(t *testing.T) {
	parse := func(args ...string) (gateway.FSSOptions, error) {
		var f fssFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(args); err != nil {
			return gateway.FSSOptions{}, err
		}
		return f.options(nil)
	}
	o, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if o.Limits != (gateway.SnapshotLimits{}).WithDefaults() || o.GC.Interval != gateway.DefaultFSSGCInterval || o.GC.Grace != time.Hour {
		t.Errorf("defaults: %+v", o)
	}
	o, err = parse("--fss-max-per-org", "10", "--fss-max-bytes-per-org", "10Gi", "--fss-max-snapshot-bytes", "1Gi",
		"--fss-max-in-flight-per-sandbox", "1", "--fss-gc-interval", "-1s", "--fss-gc-grace", "2h")
	if err != nil {
		t.Fatal(err)
	}
	if want := (gateway.SnapshotLimits{MaxPerOrg: 10, MaxBytesPerOrg: 10 << 30, MaxSnapshotBytes: 1 << 30, MaxInFlightPerSandbox: 1}); o.Limits != want || o.GC.Interval >= 0 || o.GC.Grace != 2*time.Hour {
		t.Errorf("parsed: %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--fss-max-per-org", "0"}, "--fss-max-per-org"},
		{[]string{"--fss-max-bytes-per-org", "lots"}, "--fss-max-bytes-per-org"},
		{[]string{"--fss-max-snapshot-bytes", "2Ti"}, "max snapshot bytes"},
		{[]string{"--fss-max-in-flight-per-sandbox", "-1"}, "--fss-max-in-flight-per-sandbox"},
		{[]string{"--fss-gc-grace", "1s"}, "--fss-gc-grace"},
		{[]string{"--fss-gc-interval", "0s"}, "--fss-gc-interval"},
	} {
		if _, err := parse(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}
