package main

import (
	"flag"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
)

// warmPoolFlags are the warm pool's sizing by demand (local.PoolConfig.Max and
// MemoryBytes): --warm-pool-max and --warm-pool-memory.
type warmPoolFlags struct {
	max    int
	memory string
}

func (w *warmPoolFlags) bind(fs *flag.FlagSet) {
	fs.IntVar(&w.max, "warm-pool-max", local.DefaultPoolMax, "most pre-started containers kept for one image's recent demand (its largest burst of creates lately; never below --warm-pool)")
	fs.StringVar(&w.memory, "warm-pool-memory", quantity.FormatMemory(local.DefaultPoolMemory), fmt.Sprintf("memory budget, e.g. 512Mi, of the pre-started containers kept beyond --warm-pool for demand, shared by all images (each counted at %s; 0: none)", quantity.FormatMemory(local.PooledContainerBytes)))
}

// apply sets cfg's demand sizing.
func (w *warmPoolFlags) apply(cfg *local.PoolConfig) error {
	if w.max < 0 {
		return fmt.Errorf("--warm-pool-max: %d is negative", w.max)
	}
	mem, err := quantity.ParseMemory(w.memory)
	if err != nil {
		return fmt.Errorf("--warm-pool-memory: %w", err)
	}
	cfg.Max = w.max
	cfg.MemoryBytes = mem
	if mem == 0 {
		cfg.MemoryBytes = -1 // none (0 in PoolConfig is the default)
	}
	return nil
}

// registerWarmPool serves b's warm pool on the metrics listener (cwsandbox_warm_pool_*).
func registerWarmPool(b *local.Backend, log interface{ Warn(string, ...any) }) {
	err := metrics.Default.Register(metrics.NewWarmPoolCollector(func() metrics.WarmPool {
		st := b.PoolStats()
		w := metrics.WarmPool{Ready: st.Ready, Target: st.Want, Claims: st.Claims, Misses: st.Misses, Refills: st.Refills, Dropped: st.Dropped}
		for _, s := range st.Sets {
			w.Starting += s.Starting
		}
		return w
	}))
	if err != nil {
		log.Warn("warm pool metrics", "err", err)
	}
}
