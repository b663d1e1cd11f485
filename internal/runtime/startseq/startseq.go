// Package startseq starts the containers of a multi-container sandbox in the order its
// spec asks, the same way on every backend: init containers one by one, each to exit 0;
// then every other container as soon as its DependsOn conditions hold; and every
// startup probe must pass. A backend creates the containers with their main commands
// held (the agent's standby), then hands Run the operations that start a held command,
// run a probe and wait for an exit in a named container.
package startseq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Ops are what Run needs of a backend, per container (by Container.ContainerName).
type Ops interface {
	// Start starts container name's held main command and returns once it has started.
	Start(ctx context.Context, name string) error
	// Exec runs argv in container name, bounded by timeout, and returns its exit code.
	Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (int, error)
	// Wait blocks until container name's main command has exited for good (no restart
	// follows) and returns its exit code.
	Wait(ctx context.Context, name string) (int32, error)
}

// Reasons of a Failure.
const (
	ReasonInitFailed       = "InitContainerFailed"
	ReasonProbeFailed      = "StartupProbeFailed"
	ReasonDependencyFailed = "DependencyFailed"
	ReasonStartError       = "StartError"
)

// Failure is why a group did not start: which container, a Reason* and a message.
type Failure struct {
	Container string
	Reason    string
	Message   string
}

func (f *Failure) Error() string { return fmt.Sprintf("container %q: %s", f.Container, f.Message) }

// Run starts spec's containers through ops. It returns nil once every container has
// started and every startup probe has passed, the first *Failure, or ctx's error.
// On a failure the containers already started are left to the caller to stop.
func Run(ctx context.Context, spec *runtime.Spec, ops Ops) error {
	for i := range spec.InitContainers {
		name := spec.InitContainers[i].ContainerName()
		if err := ops.Start(ctx, name); err != nil {
			return orCtx(ctx, &Failure{name, ReasonStartError, "init container did not start: " + err.Error()})
		}
		code, err := ops.Wait(ctx, name)
		if err != nil {
			return orCtx(ctx, &Failure{name, ReasonStartError, "init container: " + err.Error()})
		}
		if code != 0 {
			return &Failure{name, ReasonInitFailed, fmt.Sprintf("init container exited with code %d", code)}
		}
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fail := func(f *Failure) { cancel(f) }

	type state struct {
		started, healthy, completed chan struct{}
		code                        int32 // set before completed closes
	}
	cs := spec.Containers()
	states := make(map[string]*state, len(cs))
	awaited := map[string]bool{} // containers another waits to complete
	for _, c := range cs {
		states[c.ContainerName()] = &state{started: make(chan struct{}), healthy: make(chan struct{}), completed: make(chan struct{})}
		for _, d := range c.DependsOn {
			if d.Condition == runtime.ConditionCompleted {
				awaited[d.Container] = true
			}
		}
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		name, st := c.ContainerName(), states[c.ContainerName()]
		wg.Go(func() {
			for _, d := range c.DependsOn {
				dep := states[d.Container]
				if dep == nil { // ValidateSpec refuses this; never start on a broken promise
					fail(&Failure{name, ReasonDependencyFailed, fmt.Sprintf("depends on %q, which the sandbox does not have", d.Container)})
					return
				}
				ch := dep.started
				switch d.Condition {
				case runtime.ConditionHealthy:
					ch = dep.healthy
				case runtime.ConditionCompleted:
					ch = dep.completed
				}
				select {
				case <-ch:
				case <-ctx.Done():
					return
				}
				if d.Condition == runtime.ConditionCompleted && dep.code != 0 {
					fail(&Failure{name, ReasonDependencyFailed, fmt.Sprintf("waits for %q to complete successfully, which exited with code %d", d.Container, dep.code)})
					return
				}
			}
			if err := ops.Start(ctx, name); err != nil {
				if ctx.Err() == nil {
					fail(&Failure{name, ReasonStartError, "did not start: " + err.Error()})
				}
				return
			}
			close(st.started)
			if awaited[name] {
				wg.Go(func() {
					code, err := ops.Wait(ctx, name)
					if err != nil {
						if ctx.Err() == nil {
							fail(&Failure{name, ReasonStartError, "waiting for it to complete: " + err.Error()})
						}
						return
					}
					st.code = code
					close(st.completed)
				})
			}
			if p := c.StartupProbe; p != nil {
				if err := probe(ctx, ops, name, p); err != nil {
					var f *Failure
					if errors.As(err, &f) {
						fail(f)
					}
					return
				}
			}
			close(st.healthy)
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// Probe runs the startup probe p in the started container name through ops until it
// passes (nil), else returns a *Failure (ReasonProbeFailed) after its failure threshold,
// or ctx's error. Backends call it for a single-container sandbox, which they start
// without Run; Run probes a group's containers itself.
func Probe(ctx context.Context, ops Ops, name string, p *runtime.Probe) error {
	return probe(ctx, ops, name, p)
}

// probe runs p in container name until it passes, or fails it after its failure
// threshold.
func probe(ctx context.Context, ops Ops, name string, p *runtime.Probe) error {
	period, timeout, threshold := p.Period, p.Timeout, p.FailureThreshold
	if period <= 0 {
		period = runtime.DefaultProbePeriod
	}
	if timeout <= 0 {
		timeout = runtime.DefaultProbeTimeout
	}
	if threshold <= 0 {
		threshold = runtime.DefaultProbeFailures
	}
	if err := sleep(ctx, p.InitialDelay); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		code, err := ops.Exec(ctx, name, p.Exec, timeout)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && code == 0 {
			return nil
		}
		if attempt >= threshold {
			last := fmt.Sprintf("exit code %d", code)
			if err != nil {
				last = err.Error()
			}
			return &Failure{name, ReasonProbeFailed, fmt.Sprintf("health check did not pass in %d attempts (last: %s)", attempt, last)}
		}
		if err := sleep(ctx, period); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// orCtx returns ctx's error when ctx has ended (the failure is then its consequence),
// else f.
func orCtx(ctx context.Context, f *Failure) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return f
}
