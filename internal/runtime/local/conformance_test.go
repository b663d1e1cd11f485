package local

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestConformance runs the backend contract (runtimetest.Run) on runc, and on gVisor
// where runsc is installed.
func TestConformance(t *testing.T) {
	for _, class := range []string{"", GVisorClass} {
		name := class
		if name == "" {
			name = "runc"
		}
		t.Run(name, func(t *testing.T) {
			if class == GVisorClass {
				gvisorEnv(t) // skips without runsc
			}
			var second string
			if _, err := os.Stat(filepath.Join(testimage.Dir(), "python.tar")); err == nil {
				needPython(t) // the group tests' second image, under both classes
				second = "python"
			}
			runtimetest.Run(t, conformanceBackends(), runtimetest.Options{
				SecondImage: second,
				Image:       "busybox", ImagePath: "PATH=/bin", WorkDirImage: "workdir", WorkDir: "/root", MissingImage: "nope",
				RuntimeClass: class, StopLatency: 800 * time.Millisecond,
				Destroyed: func(t *testing.T, b runtime.Backend, id string) { checkNoLeaks(t, b.(*Backend).cfg.StateDir, id) },
			})
		})
	}
}

// conformanceBackends is runtimetest.Run's newBackend: an env per test, and a new
// Backend on its state dir for each later call.
func conformanceBackends() func(t *testing.T) runtime.Backend {
	var mu sync.Mutex
	envs := map[*testing.T]*env{}
	return func(t *testing.T) runtime.Backend {
		mu.Lock()
		defer mu.Unlock()
		if e := envs[t]; e != nil {
			return e.backend()
		}
		e := newEnv(t)
		envs[t] = e
		return e.b
	}
}
