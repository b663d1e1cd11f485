package security

import (
	"context"
	"errors"
	"math"
	"net"
	"net/url"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
)

// replyRunner is org-b's own runner answering each call with the reply it is set to
// (a well-formed one about what it was asked where none is set).
type replyRunner struct {
	tenantRunner
	rmu      sync.Mutex
	sandbox  func(id string) *runnerv1.Sandbox // Create, Get, Delete, UpdateLifetime, Pause, Resume, ExportCheckpoint
	list     []*runnerv1.Sandbox
	forks    func(targets []*runnerv1.ForkTarget) []*runnerv1.ForkResult
	job      func(snapshotID string) *runnerv1.SnapshotJob
	jobs     func(targets []*runnerv1.SnapshotTarget) []*runnerv1.SnapshotJob
	ref      *runnerv1.CheckpointRef
	capacity *runnerv1.CapacityResponse
	volume   *runnerv1.EnsureVolumeResponse
	build    []*runnerv1.BuildResponse
}

func (r *replyRunner) sb(id string) *runnerv1.Sandbox {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.sandbox != nil {
		return r.sandbox(id)
	}
	return &runnerv1.Sandbox{Id: id, State: runnerv1.State_STATE_RUNNING}
}

func (r *replyRunner) Create(_ context.Context, req *connect.Request[runnerv1.CreateRequest]) (*connect.Response[runnerv1.CreateResponse], error) {
	return connect.NewResponse(&runnerv1.CreateResponse{Sandbox: r.sb(req.Msg.GetSpec().GetId())}), nil
}

func (r *replyRunner) Get(_ context.Context, req *connect.Request[runnerv1.GetRequest]) (*connect.Response[runnerv1.GetResponse], error) {
	return connect.NewResponse(&runnerv1.GetResponse{Sandbox: r.sb(req.Msg.GetId())}), nil
}

func (r *replyRunner) Delete(_ context.Context, req *connect.Request[runnerv1.DeleteRequest]) (*connect.Response[runnerv1.DeleteResponse], error) {
	res := &runnerv1.DeleteResponse{Sandbox: r.sb(req.Msg.GetId())}
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.jobs != nil {
		res.Snapshots = r.jobs(req.Msg.GetSnapshots())
	} else {
		for _, t := range req.Msg.GetSnapshots() {
			res.Snapshots = append(res.Snapshots, &runnerv1.SnapshotJob{SnapshotId: t.GetSnapshotId(), SandboxId: req.Msg.GetId(), State: runnerv1.SnapshotJobState(runner.SnapshotCreating)})
		}
	}
	return connect.NewResponse(res), nil
}

func (r *replyRunner) UpdateLifetime(_ context.Context, req *connect.Request[runnerv1.UpdateLifetimeRequest]) (*connect.Response[runnerv1.UpdateLifetimeResponse], error) {
	return connect.NewResponse(&runnerv1.UpdateLifetimeResponse{Sandbox: r.sb(req.Msg.GetId())}), nil
}

func (r *replyRunner) Pause(_ context.Context, req *connect.Request[runnerv1.PauseRequest]) (*connect.Response[runnerv1.PauseResponse], error) {
	return connect.NewResponse(&runnerv1.PauseResponse{Sandbox: r.sb(req.Msg.GetId())}), nil
}

func (r *replyRunner) Resume(_ context.Context, req *connect.Request[runnerv1.ResumeRequest]) (*connect.Response[runnerv1.ResumeResponse], error) {
	return connect.NewResponse(&runnerv1.ResumeResponse{Sandbox: r.sb(req.Msg.GetId())}), nil
}

func (r *replyRunner) List(context.Context, *connect.Request[runnerv1.ListRequest]) (*connect.Response[runnerv1.ListResponse], error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	return connect.NewResponse(&runnerv1.ListResponse{Sandboxes: r.list}), nil
}

func (r *replyRunner) Fork(_ context.Context, req *connect.Request[runnerv1.ForkRequest]) (*connect.Response[runnerv1.ForkResponse], error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	res := &runnerv1.ForkResponse{}
	if r.forks != nil {
		res.Results = r.forks(req.Msg.GetTargets())
	} else {
		for _, t := range req.Msg.GetTargets() {
			res.Results = append(res.Results, &runnerv1.ForkResult{Sandbox: &runnerv1.Sandbox{Id: t.GetId(), State: runnerv1.State_STATE_RUNNING}})
		}
	}
	return connect.NewResponse(res), nil
}

func (r *replyRunner) ExportCheckpoint(_ context.Context, req *connect.Request[runnerv1.ExportCheckpointRequest]) (*connect.Response[runnerv1.ExportCheckpointResponse], error) {
	sb := r.sb(req.Msg.GetId())
	r.rmu.Lock()
	defer r.rmu.Unlock()
	ref := r.ref
	if ref == nil {
		ref = &runnerv1.CheckpointRef{Key: "k", Platform: "p", Bytes: 1}
	}
	return connect.NewResponse(&runnerv1.ExportCheckpointResponse{Ref: ref, Sandbox: sb}), nil
}

func (r *replyRunner) jobFor(snapshotID string) *runnerv1.SnapshotJob {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.job != nil {
		return r.job(snapshotID)
	}
	return &runnerv1.SnapshotJob{SnapshotId: snapshotID, State: runnerv1.SnapshotJobState(runner.SnapshotCreating)}
}

func (r *replyRunner) SnapshotVolume(_ context.Context, req *connect.Request[runnerv1.SnapshotVolumeRequest]) (*connect.Response[runnerv1.SnapshotJob], error) {
	return connect.NewResponse(r.jobFor(req.Msg.GetTarget().GetSnapshotId())), nil
}

func (r *replyRunner) GetSnapshotJob(_ context.Context, req *connect.Request[runnerv1.GetSnapshotJobRequest]) (*connect.Response[runnerv1.SnapshotJob], error) {
	return connect.NewResponse(r.jobFor(req.Msg.GetSnapshotId())), nil
}

func (r *replyRunner) Capacity(ctx context.Context, req *connect.Request[runnerv1.CapacityRequest]) (*connect.Response[runnerv1.CapacityResponse], error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.capacity != nil {
		return connect.NewResponse(r.capacity), nil
	}
	return r.tenantRunner.Capacity(ctx, req)
}

func (r *replyRunner) EnsureVolume(context.Context, *connect.Request[runnerv1.EnsureVolumeRequest]) (*connect.Response[runnerv1.EnsureVolumeResponse], error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.volume != nil {
		return connect.NewResponse(r.volume), nil
	}
	return connect.NewResponse(&runnerv1.EnsureVolumeResponse{CapacityBytes: 1 << 30}), nil
}

func (r *replyRunner) Build(_ context.Context, _ *connect.Request[runnerv1.BuildRequest], stream *connect.ServerStream[runnerv1.BuildResponse]) error {
	r.rmu.Lock()
	msgs := r.build
	r.rmu.Unlock()
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// buildReply is a build's stream of n step events (numbered from first, of total) and
// a result of results steps.
func buildReply(n int, first, total int32, results int) []*runnerv1.BuildResponse {
	var out []*runnerv1.BuildResponse
	for i := range n {
		out = append(out, &runnerv1.BuildResponse{Message: &runnerv1.BuildResponse_Step{Step: &runnerv1.BuildStep{Number: first + int32(i), Total: total, Instruction: "RUN x"}}}) //nolint:gosec // small
	}
	res := &runnerv1.BuildResult{ImageDigest: "sha256:" + strings.Repeat("0", 64)}
	for i := range results {
		res.Steps = append(res.Steps, &runnerv1.BuildStep{Number: int32(i + 1), Total: int32(results), Instruction: "RUN x"}) //nolint:gosec // small
	}
	return append(out, &runnerv1.BuildResponse{Message: &runnerv1.BuildResponse_Result{Result: res}})
}

// serveReplyRunner serves r as org-b's runner b-runner (its certificate naming org-b)
// and returns the gateway's client of it.
func serveReplyRunner(t *testing.T, p *tenantPlatform, r *replyRunner) *runnerapi.Client {
	t.Helper()
	cert, err := p.CA.IssueServerURIs("b-runner", []string{"b-runner", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, []*url.URL{pki.RunnerURI("org-b", "b-runner")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, h := runnerv1connect.NewRunnerServiceHandler(r)
	return p.serveRunner("b-runner", h, cert, p.CA.Pool())
}

// wantBadReply: err is the runner's fault, UNAVAILABLE CWSANDBOX_RUNNER_UNAVAILABLE
// "answered wrongly" (and runner.ErrBadReply, unless it came over the wire: wire).
func wantBadReply(t *testing.T, what string, err error, wire bool) {
	t.Helper()
	var ce *connect.Error
	if err == nil || !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable || apierr.Reason(err) != apierr.RunnerUnavailable ||
		!wire && !errors.Is(err, runner.ErrBadReply) || !strings.Contains(err.Error(), "answered wrongly") {
		t.Errorf("%s: %v, want UNAVAILABLE %s (the runner answered wrongly)", what, err, apierr.RunnerUnavailable)
	}
}

// TestTenantRunnerWrongReplies: org-b's own runner (not trusted) answers the gateway's
// calls with replies that cannot be right: about another sandbox or snapshot than asked,
// with negative counts and sizes, unknown states, timestamps no store can keep, a
// negative lifetime, huge texts, more container statuses than a sandbox has, sandboxes
// without an ID or listed twice, short strings (an address, a digest, a runtime class,
// a container's name or state, a fork error's reason) of megabytes, more or fewer forks and snapshot jobs than asked, more
// build steps than a build has (each kept by the gateway as a build log event) or steps
// numbered outside their total. The
// gateway's client of the runner takes none of them: each fails its one call, UNAVAILABLE
// CWSANDBOX_RUNNER_UNAVAILABLE "answered wrongly" (the runner's fault, not the caller's),
// and the next well-formed reply is taken. Without the checks each was taken as true
// (e.g. a Get answered with another sandbox's ID, a capacity of -2^63 millicores, a
// created_at past year 9999 that failed the gateway's create only later, in its store's
// encoding, as an unexplained error).
func TestTenantRunnerWrongReplies(t *testing.T) {
	p, ctx := newTenantPlatform(t, time.Minute, "wrong replies test CA", "org-a", "org-b")
	r := &replyRunner{}
	c := serveReplyRunner(t, p, r)
	const id = "asked0000000001"
	other := func(string) *runnerv1.Sandbox {
		return &runnerv1.Sandbox{Id: "othersandbox0001", State: runnerv1.State_STATE_RUNNING}
	}
	with := func(f func(*runnerv1.Sandbox)) func(string) *runnerv1.Sandbox {
		return func(id string) *runnerv1.Sandbox {
			sb := &runnerv1.Sandbox{Id: id, State: runnerv1.State_STATE_RUNNING}
			f(sb)
			return sb
		}
	}
	get := func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Get(ctx, id); return err }
	build := func(ctx context.Context, c *runnerapi.Client) error {
		_, err := c.Build(ctx, runner.BuildRequest{}, nil)
		return err
	}
	farTime := &timestamppb.Timestamp{Seconds: math.MaxInt64}
	cases := []struct {
		name string
		set  func(*replyRunner)
		call func(context.Context, *runnerapi.Client) error
	}{
		{"create: unknown state", func(r *replyRunner) { r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.State = 999 }) },
			func(ctx context.Context, c *runnerapi.Client) error {
				_, err := c.Create(ctx, runner.CreateRequest{})
				return err
			}},
		{"get: another sandbox", func(r *replyRunner) { r.sandbox = other }, get},
		{"get: not a sandbox ID", func(r *replyRunner) {
			r.sandbox = func(string) *runnerv1.Sandbox { return &runnerv1.Sandbox{Id: "../" + strings.Repeat("x", 1<<16)} }
		}, get},
		{"get: unknown state", func(r *replyRunner) { r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.State = -1 }) }, get},
		{"get: negative restarts", func(r *replyRunner) { r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.Restarts = math.MinInt32 }) }, get},
		{"get: negative OOM kills", func(r *replyRunner) { r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.OomKills = -1 }) }, get},
		{"get: created_at out of range", func(r *replyRunner) { r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.CreatedAt = farTime }) }, get},
		{"get: invalid ended_at nanos", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.EndedAt = &timestamppb.Timestamp{Seconds: 1, Nanos: -5} })
		}, get},
		{"get: deadline past year 9999", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.Deadline = &timestamppb.Timestamp{Seconds: 253402300800} })
		}, get},
		{"get: negative lifetime", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.Lifetime = durationpb.New(-time.Hour) })
		}, get},
		{"get: huge message", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.Message = strings.Repeat("m", 8<<20) })
		}, get},
		// Counted elements of any size: a short string of megabytes, which the gateway
		// would keep with the sandbox (memory, store) and show.
		{"get: huge image digest", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.ImageDigest = "sha256:" + strings.Repeat("a", 8<<20) })
		}, get},
		{"get: huge ip", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.Ip = strings.Repeat("1", 8<<20) })
		}, get},
		{"get: huge runtime class", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.RuntimeClass = strings.Repeat("g", 8<<20) })
		}, get},
		{"get: huge container name", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) {
				sb.Containers = []*runnerv1.ContainerStatus{{Name: strings.Repeat("c", 8<<20)}}
			})
		}, get},
		{"get: huge container state", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) {
				sb.Containers = []*runnerv1.ContainerStatus{{Name: "main", State: strings.Repeat("w", 8<<20)}}
			})
		}, get},
		{"list: huge image digest", func(r *replyRunner) {
			r.list = []*runnerv1.Sandbox{{Id: id, State: runnerv1.State_STATE_RUNNING, ImageDigest: strings.Repeat("d", 8<<20)}}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.List(ctx); return err }},
		{"fork: huge error message", func(r *replyRunner) {
			r.forks = func(ts []*runnerv1.ForkTarget) []*runnerv1.ForkResult {
				return []*runnerv1.ForkResult{{Error: &runnerv1.ForkError{Code: "internal", Message: strings.Repeat("m", 8<<20)}}}
			}
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.Fork(ctx, id, []runner.ForkTarget{{ID: "forked000000001"}})
			return err
		}},
		{"fork: huge error reason", func(r *replyRunner) {
			r.forks = func(ts []*runnerv1.ForkTarget) []*runnerv1.ForkResult {
				return []*runnerv1.ForkResult{{Error: &runnerv1.ForkError{Code: "internal", Reason: strings.Repeat("R", 8<<20)}}}
			}
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.Fork(ctx, id, []runner.ForkTarget{{ID: "forked000000001"}})
			return err
		}},
		{"get snapshot job: huge digest", func(r *replyRunner) {
			r.job = func(s string) *runnerv1.SnapshotJob {
				return &runnerv1.SnapshotJob{SnapshotId: s, Digest: strings.Repeat("0", 8<<20)}
			}
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.GetSnapshotJob(ctx, "snap1")
			return err
		}},
		{"get: a thousand container statuses", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) {
				for range 1000 {
					sb.Containers = append(sb.Containers, &runnerv1.ContainerStatus{Name: "c"})
				}
			})
		}, get},
		{"get: negative container restarts", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.Containers = []*runnerv1.ContainerStatus{{Name: "main", Restarts: -7}} })
		}, get},
		{"get: negative memory usage", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) { sb.Usage = &runnerv1.ResourceUsage{MemoryBytes: -1} })
		}, get},
		{"get: paused with a negative checkpoint", func(r *replyRunner) {
			r.sandbox = with(func(sb *runnerv1.Sandbox) {
				sb.State = runnerv1.State(runner.StatePaused)
				sb.Pause = &runnerv1.PauseStatus{CheckpointBytes: math.MinInt64}
			})
		}, get},
		{"await start: another sandbox", func(r *replyRunner) { r.sandbox = other },
			func(ctx context.Context, c *runnerapi.Client) error {
				_, err := c.AwaitStart(ctx, id, time.Second)
				return err
			}},
		{"delete: another sandbox", func(r *replyRunner) { r.sandbox = other },
			func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Delete(ctx, id, 0); return err }},
		{"update lifetime: another sandbox", func(r *replyRunner) { r.sandbox = other },
			func(ctx context.Context, c *runnerapi.Client) error {
				_, err := c.UpdateLifetime(ctx, id, time.Hour)
				return err
			}},
		{"pause: another sandbox", func(r *replyRunner) { r.sandbox = other },
			func(ctx context.Context, c *runnerapi.Client) error {
				_, err := c.Pause(ctx, id, runner.PauseOptions{})
				return err
			}},
		{"resume: another sandbox", func(r *replyRunner) { r.sandbox = other },
			func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Resume(ctx, id); return err }},
		{"export checkpoint: another sandbox", func(r *replyRunner) { r.sandbox = other },
			func(ctx context.Context, c *runnerapi.Client) error {
				_, _, err := c.ExportCheckpoint(ctx, id)
				return err
			}},
		{"export checkpoint: negative bytes", func(r *replyRunner) { r.ref = &runnerv1.CheckpointRef{Key: "k", Platform: "p", Bytes: -1} },
			func(ctx context.Context, c *runnerapi.Client) error {
				_, _, err := c.ExportCheckpoint(ctx, id)
				return err
			}},
		{"list: a sandbox without an ID", func(r *replyRunner) { r.list = []*runnerv1.Sandbox{{State: runnerv1.State_STATE_RUNNING}} },
			func(ctx context.Context, c *runnerapi.Client) error { _, err := c.List(ctx); return err }},
		{"list: a sandbox twice", func(r *replyRunner) {
			r.list = []*runnerv1.Sandbox{{Id: id, State: runnerv1.State_STATE_RUNNING}, {Id: id, State: runnerv1.State_STATE_RUNNING}}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.List(ctx); return err }},
		{"list: not a sandbox ID", func(r *replyRunner) {
			r.list = []*runnerv1.Sandbox{{Id: "Bad/ID", State: runnerv1.State_STATE_RUNNING}}
		},
			func(ctx context.Context, c *runnerapi.Client) error { _, err := c.List(ctx); return err }},
		{"list: negative restarts", func(r *replyRunner) {
			r.list = []*runnerv1.Sandbox{{Id: id, State: runnerv1.State_STATE_RUNNING, Restarts: -1}}
		},
			func(ctx context.Context, c *runnerapi.Client) error { _, err := c.List(ctx); return err }},
		{"fork: another sandbox", func(r *replyRunner) {
			r.forks = func(ts []*runnerv1.ForkTarget) []*runnerv1.ForkResult {
				return []*runnerv1.ForkResult{{Sandbox: &runnerv1.Sandbox{Id: "othersandbox0001", State: runnerv1.State_STATE_RUNNING}}}
			}
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.Fork(ctx, id, []runner.ForkTarget{{ID: "forked000000001"}})
			return err
		}},
		{"fork: more forks than targets", func(r *replyRunner) {
			r.forks = func(ts []*runnerv1.ForkTarget) []*runnerv1.ForkResult { return make([]*runnerv1.ForkResult, 100000) }
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.Fork(ctx, id, []runner.ForkTarget{{ID: "forked000000001"}})
			return err
		}},
		{"snapshot volume: another snapshot", func(r *replyRunner) {
			r.job = func(string) *runnerv1.SnapshotJob { return &runnerv1.SnapshotJob{SnapshotId: "othersnapshot"} }
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.SnapshotVolume(ctx, id, runner.SnapshotTarget{Volume: "v", SnapshotID: "snap1"})
			return err
		}},
		{"get snapshot job: negative size", func(r *replyRunner) {
			r.job = func(s string) *runnerv1.SnapshotJob { return &runnerv1.SnapshotJob{SnapshotId: s, SizeBytes: -1} }
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.GetSnapshotJob(ctx, "snap1")
			return err
		}},
		{"get snapshot job: negative content", func(r *replyRunner) {
			r.job = func(s string) *runnerv1.SnapshotJob {
				return &runnerv1.SnapshotJob{SnapshotId: s, ContentBytes: math.MinInt64}
			}
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.GetSnapshotJob(ctx, "snap1")
			return err
		}},
		{"get snapshot job: complete time out of range", func(r *replyRunner) {
			r.job = func(s string) *runnerv1.SnapshotJob {
				return &runnerv1.SnapshotJob{SnapshotId: s, CompleteTime: farTime}
			}
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, err := c.GetSnapshotJob(ctx, "snap1")
			return err
		}},
		{"delete with snapshots: fewer jobs", func(r *replyRunner) {
			r.jobs = func([]*runnerv1.SnapshotTarget) []*runnerv1.SnapshotJob { return nil }
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, _, err := c.DeleteWithSnapshots(ctx, id, 0, []runner.SnapshotTarget{{Volume: "v", SnapshotID: "snap1"}})
			return err
		}},
		{"delete with snapshots: a job of another snapshot", func(r *replyRunner) {
			r.jobs = func([]*runnerv1.SnapshotTarget) []*runnerv1.SnapshotJob {
				return []*runnerv1.SnapshotJob{{SnapshotId: "othersnapshot"}}
			}
		}, func(ctx context.Context, c *runnerapi.Client) error {
			_, _, err := c.DeleteWithSnapshots(ctx, id, 0, []runner.SnapshotTarget{{Volume: "v", SnapshotID: "snap1"}})
			return err
		}},
		{"capacity: negative CPU", func(r *replyRunner) {
			r.capacity = &runnerv1.CapacityResponse{MilliCpu: math.MinInt64, MemoryBytes: 1 << 30}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Capacity(ctx); return err }},
		{"capacity: negative GPUs", func(r *replyRunner) {
			r.capacity = &runnerv1.CapacityResponse{MilliCpu: 1000, MemoryBytes: 1 << 30, Gpus: -1}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Capacity(ctx); return err }},
		{"capacity: negative running", func(r *replyRunner) {
			r.capacity = &runnerv1.CapacityResponse{MilliCpu: 1000, MemoryBytes: 1 << 30, Running: -5}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Capacity(ctx); return err }},
		{"capacity: negative max sandboxes", func(r *replyRunner) {
			r.capacity = &runnerv1.CapacityResponse{MilliCpu: 1000, MemoryBytes: 1 << 30, MaxSandboxes: -1}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Capacity(ctx); return err }},
		{"capacity: NaN overcommit", func(r *replyRunner) {
			r.capacity = &runnerv1.CapacityResponse{MilliCpu: 1000, MemoryBytes: 1 << 30, CpuOvercommit: math.NaN()}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Capacity(ctx); return err }},
		{"capacity: edge port out of range", func(r *replyRunner) {
			r.capacity = &runnerv1.CapacityResponse{MilliCpu: 1000, MemoryBytes: 1 << 30, EdgeDomain: "e.example", EdgePort: 70000}
		}, func(ctx context.Context, c *runnerapi.Client) error { _, err := c.Capacity(ctx); return err }},
		{"build: more step events than a build has", func(r *replyRunner) { r.build = buildReply(5000, 1, 5000, 1) }, build},
		{"build: a step past its total", func(r *replyRunner) { r.build = buildReply(1, 7, 2, 1) }, build},
		{"build: a negative step", func(r *replyRunner) { r.build = buildReply(1, -3, 2, 1) }, build},
		{"build: a result of more steps than a build has", func(r *replyRunner) { r.build = buildReply(0, 1, 1, 5000) }, build},
		{"ensure volume: negative capacity", func(r *replyRunner) { r.volume = &runnerv1.EnsureVolumeResponse{CapacityBytes: -1} },
			func(ctx context.Context, c *runnerapi.Client) error {
				_, err := c.EnsureVolume(ctx, runner.RegisteredVolume{Org: "org-b", ClaimName: "v"})
				return err
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r.rmu.Lock()
			r.sandbox, r.list, r.forks, r.job, r.jobs, r.ref, r.capacity, r.volume, r.build = nil, nil, nil, nil, nil, nil, nil, nil, nil
			tc.set(r)
			r.rmu.Unlock()
			wantBadReply(t, tc.name, tc.call(ctx, c), false)
		})
	}
	// The runner answering well again: taken.
	r.rmu.Lock()
	r.sandbox, r.list, r.forks, r.job, r.jobs, r.ref, r.capacity, r.volume, r.build = nil, nil, nil, nil, nil, nil, nil, nil, nil
	r.rmu.Unlock()
	if sb, err := c.Get(ctx, id); err != nil || sb.ID != id {
		t.Errorf("a well-formed Get reply: %+v, %v", sb.ID, err)
	}
	r.rmu.Lock()
	r.build = buildReply(3, 1, 3, 3)
	r.rmu.Unlock()
	if res, err := c.Build(ctx, runner.BuildRequest{}, nil); err != nil || len(res.Steps) != 3 {
		t.Errorf("a well-formed build: %v", err)
	}
}

// TestTenantRunnerOutOfRangeTime: org-b's own runner answers org-b's create with a
// created_at the gateway cannot keep (past year 9999). The create was taken from the
// runner and failed later, in the gateway's store encoding, as UNAVAILABLE "encode status:
// json: ... year outside of range": no reason, nothing naming the runner. It must fail
// UNAVAILABLE CWSANDBOX_RUNNER_UNAVAILABLE naming the runner as having answered wrongly,
// and the gateway answer org-b's next calls.
func TestTenantRunnerOutOfRangeTime(t *testing.T) {
	p, ctx := newTenantPlatform(t, time.Minute, "out of range time test CA", "org-a", "org-b")
	keyB := p.key("org-b", auth.RoleAdmin)
	r := &replyRunner{sandbox: func(id string) *runnerv1.Sandbox {
		return &runnerv1.Sandbox{Id: id, State: runnerv1.State_STATE_CREATING, CreatedAt: &timestamppb.Timestamp{Seconds: 253402300800 * 2}}
	}}
	c := serveReplyRunner(t, p, r)
	p.startGateway(gateway.Config{Runners: []runner.Handle{c}})
	b := p.sandboxes(keyB)
	var err error
	for {
		_, err = b.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}, RunnerIds: []string{"b-runner"}}}}))
		if err == nil || strings.Contains(err.Error(), "b-runner") && !strings.Contains(err.Error(), "not verified") && apierr.Reason(err) != apierr.RunnerUnavailable ||
			strings.Contains(err.Error(), "answered wrongly") || strings.Contains(err.Error(), "encode") || ctx.Err() != nil {
			break // the runner was reached (until its owner is known, it takes nothing)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantBadReply(t, "org-b's create answered with created_at past year 9999", err, true)
	if _, err := b.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{})); err != nil {
		t.Errorf("the gateway after the reply: ListSandboxes %v", err)
	}
}

// rawListCodec is a runner's protobuf codec that answers List with the bytes it holds
// (what a runner may put on the wire, without building the messages they decode to).
type rawListCodec struct{ list []byte }

func (rawListCodec) Name() string { return "proto" }

func (c rawListCodec) Marshal(m any) ([]byte, error) {
	if _, ok := m.(*runnerv1.ListResponse); ok {
		return c.list, nil
	}
	return proto.Marshal(m.(proto.Message))
}

func (rawListCodec) Unmarshal(b []byte, m any) error { return proto.Unmarshal(b, m.(proto.Message)) }

// TestTenantRunnerAmplifiedReply: org-b's own runner answers List with 8 MiB of empty
// sandboxes (2 bytes each on the wire: 4 Mi of them). Decoded, each is a message of
// ~300 bytes: the gateway allocated ~150 times the reply (1.2 GiB here; ~19 GiB for a
// reply of MaxMessageBytes), every reconcile round, from any organization's runner. The
// gateway's client must refuse the reply before decoding it (at most
// runnerapi.MaxReplyElements elements), as the runner answering wrongly, allocating
// little.
func TestTenantRunnerAmplifiedReply(t *testing.T) {
	p, ctx := newTenantPlatform(t, time.Minute, "amplified reply test CA", "org-a", "org-b")
	const n = 4 << 20
	list := make([]byte, 0, 2*n)
	for range n {
		list = append(list, 0x0a, 0x00) // ListResponse.sandboxes (field 1), an empty Sandbox
	}
	cert, err := p.CA.IssueServerURIs("b-runner", []string{"b-runner", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, []*url.URL{pki.RunnerURI("org-b", "b-runner")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, h := runnerv1connect.NewRunnerServiceHandler(&replyRunner{}, connect.WithCodec(rawListCodec{list: list}))
	c := p.serveRunner("b-runner", h, cert, p.CA.Pool())
	if _, err := c.Capacity(ctx); err != nil { // connected, its owner known
		t.Fatal(err)
	}
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	_, err = c.List(ctx)
	goruntime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a List reply of %d bytes (%d empty sandboxes): %v; %d MiB allocated", len(list), n, err, alloc>>20)
	wantBadReply(t, "a List reply of 4 Mi empty sandboxes", err, false)
	if alloc > 128<<20 {
		t.Errorf("the gateway's client allocated %d MiB for a reply of %d MiB, want at most 128 MiB", alloc>>20, len(list)>>20)
	}
}
