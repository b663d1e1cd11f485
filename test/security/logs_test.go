package security

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// forgeIndex appends to the sandbox's own log a million one-byte chunks with a record
// each (24 MiB of index for 1 MiB of log), valid in every way a reader checks.
const forgeIndex = `
import os, struct
d = "/.sandboxd/run/logs/"
size = os.path.getsize(d + "main.log")
with open(d + "main.idx", "rb") as f:
    f.seek(-24, 2)
    nanos = struct.unpack_from("<q", f.read(24), 8)[0]
n = 1 << 20
idx = bytearray(24 * n)
for i in range(n):
    struct.pack_into("<QqIB3x", idx, 24 * i, size + i, nanos + 1 + i, 1, 1)
with open(d + "main.log", "ab") as f:
    f.write(b"x" * n)
with open(d + "main.idx", "ab") as f:
    f.write(idx)
print("forged", n)
`

// TestArchivedLogWithForgedIndexKeepsMemoryFlat: the runner serves an ended sandbox's log
// from the files the sandbox could write. Root in a sandbox forges its index (a million
// records) and ends; concurrent reads of its log must not grow the runner's memory with
// what the index claims, and must still answer.
func TestArchivedLogWithForgedIndexKeepsMemoryFlat(t *testing.T) {
	d := needDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := d.sandboxes(d.KeyB)
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{
		Name: "main", Image: "python:3.11", Command: "/bin/sh",
		Args: []string{"-c", `trap "exit 0" TERM; echo hello; sleep infinity & wait`},
	}}}
	res, err := b.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = b.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	state := func() sandboxv1.State {
		st, err := b.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return st.Msg.GetStatus().GetState()
	}
	for state() != sandboxv1.State_STATE_RUNNING {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // "hello" is in the log
	if out, err := execOut(ctx, b, id, "python3", "-c", forgeIndex); err != nil || out != fmt.Sprintf("forged %d\n", 1<<20) {
		t.Fatalf("forge the index: %q %v", out, err)
	}
	if _, err := b.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 5})); err != nil {
		t.Fatal(err)
	}
	for state() != sandboxv1.State_STATE_TERMINATED {
		time.Sleep(100 * time.Millisecond)
	}

	time.Sleep(500 * time.Millisecond)
	before, sampled := sampleRSS(t, d.Pid(), 10*time.Millisecond)
	// Reads that check the whole index (a since after the end), and reads of the start.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			req := &sandboxv1.StreamLogsRequest{SandboxId: id}
			if i%2 == 0 {
				req.SinceTime = timestamppb.New(time.Now().Add(time.Hour))
			}
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			st, err := b.StreamLogs(cctx, connect.NewRequest(req))
			if err != nil {
				t.Errorf("logs: %v", err)
				return
			}
			defer st.Close()
			var got []byte
			for st.Receive() {
				if e := st.Msg().GetError(); e != nil {
					t.Errorf("logs: %s %s", e.GetCode(), e.GetMessage())
					return
				}
				got = append(got, st.Msg().GetData()...)
				if len(got) >= len("hello\n") {
					break
				}
			}
			if err := st.Err(); err != nil {
				t.Errorf("logs: %v", err)
			}
			if want := map[bool]string{true: "", false: "hello\n"}[i%2 == 0]; string(got) != want {
				t.Errorf("logs (since after the end %v): %q, want %q", i%2 == 0, got, want)
			}
		})
	}
	wg.Wait()
	peak := sampled()
	const bound = 48 << 20
	t.Logf("RSS before %d MiB, peak %d MiB (+%d MiB) over 16 reads of a forged 24 MiB index", before>>20, peak>>20, (peak-before)>>20)
	if peak-before > bound {
		t.Errorf("RSS grew by %d MiB reading the forged log, want < %d MiB", (peak-before)>>20, bound>>20)
	}
}
