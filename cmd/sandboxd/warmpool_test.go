package main

import (
	"flag"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime/local"
)

func TestWarmPoolFlags(t *testing.T) {
	for _, c := range []struct {
		args    []string
		max     int
		memory  int64
		wantErr bool
	}{
		{nil, local.DefaultPoolMax, local.DefaultPoolMemory, false},
		{[]string{"--warm-pool-max", "200", "--warm-pool-memory", "1Gi"}, 200, 1 << 30, false},
		{[]string{"--warm-pool-memory", "0"}, local.DefaultPoolMax, -1, false}, // none
		{[]string{"--warm-pool-memory", "lots"}, 0, 0, true},
		{[]string{"--warm-pool-max", "-1"}, 0, 0, true},
	} {
		var w warmPoolFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		w.bind(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		var cfg local.PoolConfig
		err := w.apply(&cfg)
		if (err != nil) != c.wantErr {
			t.Errorf("%v: err %v", c.args, err)
			continue
		}
		if err == nil && (cfg.Max != c.max || cfg.MemoryBytes != c.memory) {
			t.Errorf("%v: Max %d MemoryBytes %d, want %d %d", c.args, cfg.Max, cfg.MemoryBytes, c.max, c.memory)
		}
	}
}
