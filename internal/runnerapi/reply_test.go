package runnerapi

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// longText is n bytes of text like a backend's, with multi-byte characters (a bound
// counts bytes, not characters): seg repeated, cut on a character boundary and
// padded with ASCII to exactly n bytes.
func longText(seg string, n int) string {
	s := strings.Repeat(seg, n/len(seg)+1)
	k := n
	for !utf8.RuneStart(s[k]) {
		k--
	}
	return s[:k] + strings.Repeat("x", n-k)
}

// runscError is what a fork of a gVisor sandbox can fail with: runsc's output, which
// has no bound of its own.
func runscError(n int) error {
	return fmt.Errorf("fork: restore checkpoint: runsc restore: exit status 128: %s",
		longText(`W1207 16:21:54.123456 gofer.go:312] mount "/var/lib/sandboxd/sandboxes/sb-ä1/rootfs" → "/": permission denied; `, n))
}

// TestRunnerRepliesWithinBounds: what a runner fills into its replies from a backend's
// text is clipped to the bounds the gateway checks them against, so a long runsc
// message is one clipped error, not a Fork reply the gateway refuses whole.
func TestRunnerRepliesWithinBounds(t *testing.T) {
	t.Run("fork error", func(t *testing.T) {
		res := forkResponse([]runner.ForkResult{
			{Sandbox: runner.Sandbox{ID: "sb-fork-1"}, Err: runscError(300 << 10)},
			{Sandbox: runner.Sandbox{ID: "sb-fork-2"}},
		})
		fe := res.GetResults()[0].GetError()
		if err := checkForkError("r1", "sb-fork-1", fe); err != nil {
			t.Fatalf("a real runner's fork error refused: %v", err)
		}
		if m := fe.GetMessage(); len(m) > maxReplyText || !utf8.ValidString(m) || !strings.HasSuffix(m, textclip.Marker) ||
			!strings.Contains(m, "runsc restore") {
			t.Errorf("fork error message: %d bytes, valid %v, %q…", len(m), utf8.ValidString(m), m[:min(len(m), 80)])
		}
		if fe.GetCode() == "" {
			t.Error("fork error without a code")
		}
	})
	t.Run("sandbox", func(t *testing.T) {
		huge := longText("kubelet: Back-off pulling image «registry.example.com/team/app»; ", 200<<10)
		p := sandboxToProto(runner.Sandbox{
			ID: "sb-long-1", State: runner.StateFailed, Reason: huge, Message: huge,
			IP: longText("fd00::ä", 2000), RuntimeClass: longText("gvisör-", 2000), ImageDigest: longText("sha256:ä", 2000),
			Containers: []runtime.ContainerStatus{{Name: longText("sidecär-", 2000), State: longText("waiting: ", 2000), Reason: huge, Message: huge}},
		})
		if err := checkSandbox("r1", "sb-long-1", p); err != nil {
			t.Fatalf("a sandbox with a backend's long text refused: %v", err)
		}
		if c := p.GetContainers()[0]; !utf8.ValidString(c.GetMessage()) || !strings.HasSuffix(c.GetName(), textclip.Marker) {
			t.Errorf("container status not clipped: name %d bytes", len(c.GetName()))
		}
	})
	t.Run("snapshot job", func(t *testing.T) {
		p := jobToProto(runner.SnapshotJob{SnapshotID: "snap-1", SandboxID: "sb-1", Volume: longText("vol-ü", 5000),
			State: runner.SnapshotFailed, Reason: "Failed", Message: runscError(100 << 10).Error(), Digest: longText("sha256:ö", 5000)})
		if err := checkJob("r1", "snap-1", p); err != nil {
			t.Fatalf("a snapshot job with a backend's long text refused: %v", err)
		}
	})
}

// TestReplyBoundaries: a short field of a runner's reply may be maxReplyShort bytes
// (1024), not one more; a text field maxReplyText (64 KiB); bytes, not characters.
func TestReplyBoundaries(t *testing.T) {
	const short, text = maxReplyShort, maxReplyText
	if short != 1024 || text != 64<<10 {
		t.Fatalf("bounds %d, %d: the documented ones are 1024 and 65536 (docs/admin.md)", short, text)
	}
	shortSeg := "registry.example.com/tëam/ïmage-"
	textSeg := "runsc: restore: gofer: «/var/lib/sandboxd/sandboxes/sb-1/rootfs»: permission denied; "
	sandbox := func(f func(p *runnerv1.Sandbox, s string)) func(string) error {
		return func(s string) error {
			p := &runnerv1.Sandbox{Id: "sb-b-1", State: runnerv1.State_STATE_RUNNING,
				Containers: []*runnerv1.ContainerStatus{{Name: "main", State: "running"}}}
			f(p, s)
			return checkSandbox("r1", "sb-b-1", p)
		}
	}
	fork := func(f func(p *runnerv1.ForkError, s string)) func(string) error {
		return func(s string) error {
			p := &runnerv1.ForkError{Code: "internal", Reason: "CWSANDBOX_INTERNAL", Message: "fork failed"}
			f(p, s)
			return checkForkError("r1", "sb-b-2", p)
		}
	}
	job := func(f func(p *runnerv1.SnapshotJob, s string)) func(string) error {
		return func(s string) error {
			p := &runnerv1.SnapshotJob{SnapshotId: "snap-b-1", SandboxId: "sb-b-1", Volume: "data", Digest: "sha256:00"}
			f(p, s)
			return checkJob("r1", "snap-b-1", p)
		}
	}
	for _, tc := range []struct {
		what  string
		bound int
		seg   string
		check func(string) error
	}{
		{"ip", short, shortSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.Ip = s })},
		{"runtime_class", short, shortSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.RuntimeClass = s })},
		{"image_digest", short, shortSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.ImageDigest = s })},
		{"containers[0].name", short, shortSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.Containers[0].Name = s })},
		{"containers[0].state", short, shortSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.Containers[0].State = s })},
		{"sandbox reason", text, textSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.Reason = s })},
		{"sandbox message", text, textSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.Message = s })},
		{"containers[0].message", text, textSeg, sandbox(func(p *runnerv1.Sandbox, s string) { p.Containers[0].Message = s })},
		{"fork code", short, shortSeg, fork(func(p *runnerv1.ForkError, s string) { p.Code = s })},
		{"fork reason", short, shortSeg, fork(func(p *runnerv1.ForkError, s string) { p.Reason = s })},
		{"fork message", text, textSeg, fork(func(p *runnerv1.ForkError, s string) { p.Message = s })},
		{"job volume", short, shortSeg, job(func(p *runnerv1.SnapshotJob, s string) { p.Volume = s })},
		{"job digest", short, shortSeg, job(func(p *runnerv1.SnapshotJob, s string) { p.Digest = s })},
		{"job message", text, textSeg, job(func(p *runnerv1.SnapshotJob, s string) { p.Message = s })},
	} {
		t.Run(tc.what, func(t *testing.T) {
			at, over := longText(tc.seg, tc.bound), longText(tc.seg, tc.bound+1)
			if len(at) != tc.bound || len(over) != tc.bound+1 || !utf8.ValidString(at) || !utf8.ValidString(over) {
				t.Fatalf("test values: %d and %d bytes", len(at), len(over))
			}
			if err := tc.check(at); err != nil {
				t.Errorf("%d bytes refused: %v", tc.bound, err)
			}
			err := tc.check(over)
			if err == nil || !errors.Is(err, runner.ErrBadReply) {
				t.Errorf("%d bytes: %v, want a bad reply", tc.bound+1, err)
			}
		})
	}
}
