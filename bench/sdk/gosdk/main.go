// Command gosdk is bench_sdk.py with the Go SDK (sdk/go): API call → first command,
// sequential, staggered or burst, against CWSANDBOX_BASE_URL with CWSANDBOX_API_KEY.
//
//	gosdk IMAGE sequential N
//	gosdk IMAGE staggered N INTERVAL_MS
//	gosdk IMAGE burst N
//	gosdk purge
//
// One run is Client.Create then ExecUnary(["true"]) (which waits for the sandbox to
// run), timed from the call; its sandbox is deleted afterwards (not timed). It prints
// one line per run (`ok <ms>` or `fail <error>`) and then `wall <ms>`, as
// bench_sdk.py does; scripts/bench-sdk.sh summarises both. purge deletes every sandbox
// of the key's organization (run.py's teardown, before it stops the server).
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gosdk:", err)
		os.Exit(1)
	}
}

type bench struct {
	c     *sandbox.Client
	image string

	mu   sync.Mutex
	made []*sandbox.Sandbox
	out  []string
}

func run(args []string) error {
	if len(args) == 1 && args[0] == "purge" {
		c, err := sandbox.FromEnv()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := c.Purge(ctx, sandbox.PurgeOptions{All: true})
		if err != nil {
			return err
		}
		fmt.Printf("purged %d, failed %d\n", res.Count, len(res.Failed)+len(res.Retryable))
		return nil
	}
	if len(args) < 3 {
		return fmt.Errorf("usage: gosdk IMAGE sequential|staggered|burst N [INTERVAL_MS], or gosdk purge")
	}
	image, mode := args[0], args[1]
	n, err := strconv.Atoi(args[2])
	if err != nil || n < 1 || n > 1000 {
		return fmt.Errorf("runs %q: want 1-1000", args[2])
	}
	var interval time.Duration
	switch mode {
	case "sequential", "burst":
	case "staggered":
		if len(args) < 4 {
			return fmt.Errorf("staggered needs INTERVAL_MS")
		}
		ms, err := strconv.Atoi(args[3])
		if err != nil || ms < 0 {
			return fmt.Errorf("interval %q: want milliseconds ≥ 0", args[3])
		}
		interval = time.Duration(ms) * time.Millisecond
	default:
		return fmt.Errorf("mode %q: want sequential, staggered or burst", mode)
	}
	c, err := sandbox.FromEnv()
	if err != nil {
		return err
	}
	b := &bench{c: c, image: image}
	ctx := context.Background()
	b.once(ctx) // warm-up: connection, image cache
	b.stopAll(ctx)
	if !strings.HasPrefix(b.out[0], "ok") {
		return fmt.Errorf("warm-up: %s", b.out[0])
	}
	b.out = nil
	t0 := time.Now()
	if mode == "sequential" {
		for range n {
			b.once(ctx)
			b.stopAll(ctx)
		}
	} else {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { b.once(ctx) })
			if interval > 0 && i < n-1 {
				time.Sleep(interval)
			}
		}
		wg.Wait()
	}
	wall := time.Since(t0)
	b.stopAll(ctx)
	for _, l := range b.out {
		fmt.Println(l)
	}
	fmt.Printf("wall %.3f\n", ms(wall))
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (b *bench) once(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	line := func() string {
		sb, err := b.c.Create(ctx, sandbox.Spec{Image: b.image})
		if err != nil {
			return "fail create: " + err.Error()
		}
		b.mu.Lock()
		b.made = append(b.made, sb)
		b.mu.Unlock()
		res, err := sb.ExecUnary(ctx, []string{"true"}, sandbox.UnaryExecOptions{})
		if err != nil {
			return "fail exec: " + err.Error()
		}
		if res.ExitCode != 0 {
			return fmt.Sprintf("fail exit code %d", res.ExitCode)
		}
		return fmt.Sprintf("ok %.3f", ms(time.Since(t0)))
	}()
	b.mu.Lock()
	b.out = append(b.out, strings.Join(strings.Fields(line), " "))
	b.mu.Unlock()
}

func (b *bench) stopAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, sb := range b.made {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			_ = b.c.Delete(dctx, sb.ID())
		})
	}
	wg.Wait()
	b.made = nil
}
