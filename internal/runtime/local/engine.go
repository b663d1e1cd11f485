package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Container-engine sandboxes (runtime.Spec.Engine, control CONTROL_CONTAINER_ENGINE):
// Docker Engine runs inside a gVisor sandbox and `docker compose` runs the caller's file
// there. Only the gvisor class hosts one: every privilege the engine needs (all
// capabilities, raw sockets for its bridge, mounts, cgroups) is the sandbox's inside
// gVisor's own kernel, and the host sees only the sentry. Under runc those privileges
// would be the host kernel's, so runc refuses the mode.
//
// The engine sandbox differs from others in: runsc runs with --net-raw (this sandbox
// only; its bridge port is pinned to its MAC and address, network/antispoof); the
// process has every capability and no_new_privs off (inside gVisor); no cgroup mount at
// /sys/fs/cgroup (cws-engine mounts its own v1 hierarchies); a host-owned read-only dir
// at engineMount holds the normalized Compose file, the project name and each of
// Engine.Images as a docker-archive, written by the backend through the image store
// (ImageArchiver: its registry guard, credentials and mirrors, so the services run the
// images the policy allowed). Its main process is the engine image's cws-engine
// (dockerd); Create runs `cws-engine-up` by exec and the sandbox is RUNNING only once
// `docker compose up --wait` succeeded; otherwise Create fails naming the failing
// services (cws-engine-up's last stderr line).

// ImageArchiver writes an image as a docker-archive of at most limit bytes; an Images
// that implements it lets the backend host container engines.
type ImageArchiver interface {
	WriteArchive(ctx context.Context, ref string, creds *runtime.Credentials, w io.Writer, limit int64) error
}

const (
	engineMount   = "/cws-engine"
	dirEngine     = "engine" // in the sandbox dir: what is mounted at engineMount
	engineEntry   = "/usr/local/bin/cws-engine"
	engineUp      = "/usr/local/bin/cws-engine-up"
	engineFailTag = "cws-engine: failing services: "
	// maxEngineArchiveBytes bounds all of an engine sandbox's image archives together
	// (they sit in its dir on the host until it is destroyed).
	maxEngineArchiveBytes = 4 << 30
	// engineUpTimeout bounds `cws-engine-up` (loading the images, compose up --wait).
	engineUpTimeout = 5 * time.Minute
	// maxEngineOutput bounds what Create keeps of cws-engine-up's output.
	maxEngineOutput = 64 << 10
	// maxEngineReason bounds what of that output (the sandbox's own text) the failure
	// message carries.
	maxEngineReason = 1024
)

// engineRunscFlags are the runsc flags of an engine sandbox on top of runscFlags.
var engineRunscFlags = []string{"--net-raw"}

// EngineUnavailable implements runtime.EngineHost.
func (b *Backend) EngineUnavailable(class string) string {
	if class == "" {
		class = b.cfg.DefaultRuntime
	}
	rt, ok := b.runtimes[class]
	switch {
	case !ok:
		return fmt.Sprintf("the backend has no runtime class %q", class)
	case !rt.gvisor:
		return fmt.Sprintf("runtime class %q is not gVisor: the engine's privileges would be the host kernel's", class)
	}
	if _, ok := b.cfg.Images.(ImageArchiver); !ok {
		return "its image store cannot write image archives for the engine"
	}
	return ""
}

var _ runtime.EngineHost = (*Backend)(nil)

// writeEngineDir writes what engineMount shows: compose.yaml, project and
// images/<i>.tar, host-owned and read-only to the sandbox.
func (b *Backend) writeEngineDir(ctx context.Context, dir string, e *runtime.Engine) error {
	ar, ok := b.cfg.Images.(ImageArchiver)
	if !ok {
		return fmt.Errorf("%w: the image store cannot write image archives", runtime.ErrEngineUnsupported)
	}
	d := filepath.Join(dir, dirEngine)
	if err := os.MkdirAll(filepath.Join(d, "images"), 0o755); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"compose.yaml": e.Compose, "project": []byte(e.Project)} {
		if err := os.WriteFile(filepath.Join(d, name), data, 0o644); err != nil {
			return err
		}
	}
	left := int64(maxEngineArchiveBytes)
	for i, ref := range e.Images {
		p := filepath.Join(d, "images", fmt.Sprintf("%02d.tar", i))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		err = ar.WriteArchive(ctx, ref, e.PullCredentials[ref], f, left)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("engine image %s: %w", ref, err)
		}
		if fi, err := os.Stat(p); err == nil {
			left -= fi.Size()
		}
	}
	return nil
}

// engineUpFailed is what Create returns when the engine did not bring the file up.
func engineUpFailed(stderr string, err error) error {
	msg := ""
	if err != nil {
		msg = err.Error()
	} else {
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if s, ok := strings.CutPrefix(last, engineFailTag); ok {
			msg = "docker compose up failed: failing services: " + textclip.Clip(s, maxEngineReason)
		} else {
			msg = "docker compose up failed: " + textclip.Clip(strings.TrimSpace(tailString(stderr, maxEngineReason)), maxEngineReason)
		}
	}
	return &startseq.Failure{Container: runtime.EngineContainerName, Reason: startseq.ReasonStartError, Message: msg}
}

// engineUp runs cws-engine-up in sandbox id (by exec through its agent) and fails naming
// the failing services.
func (b *Backend) engineUp(ctx context.Context, id string) error {
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.DialAgent(ctx, id, "") })
	ctx, cancel := context.WithTimeout(ctx, engineUpTimeout+30*time.Second)
	defer cancel()
	resp, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{
		Command: []string{engineUp, engineMount}, MaxOutputBytes: maxEngineOutput,
		Timeout: durationpb.New(engineUpTimeout),
	}))
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ctx.Err()
		}
		return engineUpFailed("", fmt.Errorf("cws-engine-up: %w", err))
	}
	if resp.Msg.ExitCode != 0 {
		return engineUpFailed(string(resp.Msg.Stderr), nil)
	}
	return nil
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// allCaps are the capabilities of an engine sandbox's process: every one runsc knows
// (it refuses CAP_PERFMON, CAP_BPF and CAP_CHECKPOINT_RESTORE). Inside gVisor they are
// the sandbox's own kernel's.
var allCaps = slices.DeleteFunc(slices.Clone(runtime.Capabilities), func(c string) bool {
	return c == "CAP_PERFMON" || c == "CAP_BPF" || c == "CAP_CHECKPOINT_RESTORE"
})
