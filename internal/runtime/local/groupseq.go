package local

import (
	"context"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TODO(issue 19): replace with internal/runtime/startseq once it is on main (the lead's
// package with this interface). This stand-in runs the same order, one container at a
// time: init containers one by one (each must exit 0), then each other container once
// its depends_on conditions hold, and every startup probe must pass.

type seqOps interface {
	Start(ctx context.Context, name string) error
	Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (int, error)
	Wait(ctx context.Context, name string) (int32, error)
}

func runStartSeq(ctx context.Context, spec *runtime.Spec, ops seqOps) error {
	for i := range spec.InitContainers {
		name := spec.InitContainers[i].ContainerName()
		if err := ops.Start(ctx, name); err != nil {
			return fmt.Errorf("init container %q: %w", name, err)
		}
		code, err := ops.Wait(ctx, name)
		if err != nil {
			return fmt.Errorf("init container %q: %w", name, err)
		}
		if code != 0 {
			return fmt.Errorf("init container %q failed: exit code %d", name, code)
		}
	}
	started := map[string]bool{}
	healthy := map[string]bool{}
	completed := map[string]bool{}
	probe := func(c *runtime.Container) error {
		p := c.StartupProbe
		if p == nil {
			return nil
		}
		period, timeout, fails := p.Period, p.Timeout, p.FailureThreshold
		if period <= 0 {
			period = runtime.DefaultProbePeriod
		}
		if timeout <= 0 {
			timeout = runtime.DefaultProbeTimeout
		}
		if fails <= 0 {
			fails = runtime.DefaultProbeFailures
		}
		time.Sleep(p.InitialDelay)
		for i := 0; i < fails; i++ {
			if code, err := ops.Exec(ctx, c.ContainerName(), p.Exec, timeout); err == nil && code == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(period):
			}
		}
		return fmt.Errorf("container %q: startup probe failed", c.ContainerName())
	}
	todo := spec.Containers()
	for len(todo) > 0 {
		progressed := false
		for i := 0; i < len(todo); i++ {
			c := todo[i]
			ready := true
			for _, d := range c.DependsOn {
				switch d.Condition {
				case runtime.ConditionStarted:
					ready = ready && started[d.Container]
				case runtime.ConditionHealthy:
					ready = ready && healthy[d.Container]
				case runtime.ConditionCompleted:
					if started[d.Container] && !completed[d.Container] {
						code, err := ops.Wait(ctx, d.Container)
						if err != nil || code != 0 {
							return fmt.Errorf("container %q: dependency %q did not complete (exit %d, %v)", c.ContainerName(), d.Container, code, err)
						}
						completed[d.Container] = true
					}
					ready = ready && completed[d.Container]
				}
			}
			if !ready {
				continue
			}
			name := c.ContainerName()
			if err := ops.Start(ctx, name); err != nil {
				return fmt.Errorf("container %q: %w", name, err)
			}
			started[name] = true
			if err := probe(c); err != nil {
				return err
			}
			healthy[name] = true
			todo = append(todo[:i], todo[i+1:]...)
			i--
			progressed = true
		}
		if !progressed {
			return fmt.Errorf("containers cannot start: their dependencies never hold")
		}
	}
	return nil
}
