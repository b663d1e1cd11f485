// Package pausebench measures pause, resume and fork of gVisor sandboxes end to end
// against a real `sandboxd dev` (the package starts one of its own, on loopback ports,
// bridge, subnet and cgroup parent of its own, from bin/sandboxd or $SANDBOXD_BIN),
// through the Go SDK (sandboxd.sandbox.v1.SandboxStateService) and the raw unary Exec:
//
//   - an idle Python sandbox (runtime class gvisor, the python test image): pause with
//     resources released (API call → returns), resume (call → returns, and call → the
//     first exec has answered), fork ×1 (call → the fork runs and has answered an exec),
//     fork ×10 (call → every fork has answered an exec: wall time), and the checkpoint's
//     size (PauseStatus.CheckpointBytes); p50 and p99 of each;
//   - the same with a Python sandbox holding 512 MiB resident (random bytes, so that the
//     checkpoint's compression gains nothing): pause in ms per GiB resident;
//   - floors measured in the same run: `runsc checkpoint` + `runsc restore` of a plain
//     busybox container (an OCI bundle of the busybox test image's rootfs, the same runsc
//     binary and platform flags as the runner's, no network), which is what sandboxd adds
//     to; and a fresh create → first exec of the same Python image under gvisor, which
//     is what a fork competes with.
//
// The runner's own pause time (its "sandbox paused" log line, field took) is printed next
// to the API's, so the gateway's share is visible.
//
// Targets (2-core machine) are printed next to the numbers: resume p50 ≤ 150 ms, fork ×1
// p50 ≤ 250 ms (idle), fork ×10 ≤ 1.5 s wall, pause ≤ 1 s per GiB resident.
//
// Run with `make bench` (-benchtime 50x: 50 rounds idle, fewer with 512 MiB) or, as `make
// bench-smoke` does, -benchtime 1x, which uses small sizes (64 MiB resident, fork ×3
// instead of ×10) so that the flow is exercised in well under two minutes. Needs root
// and runsc (`make runsc`); without either the benchmarks skip. The policy of the dev
// server's runner is set to allow the gvisor class (the dev default allows no pin).
//
// BenchmarkPauseAPI (api_test.go) is the API-level view of the idle sandbox with its
// breakdown: resume, fork ×1 and fork ×10, each next to the runner's own time for the
// same operation in the same run, and the p50 of every step the gateway, the runner and
// the local backend log for it (internal/span: the "steps" field of their "sandbox
// resumed" / "sandbox forked" / "sandbox fork steps" lines). With $SANDBOXD_BIN_B it
// runs a second server of another binary (or runsc, $SANDBOXD_RUNSC_B) and alternates
// the rounds between the two: an A/B comparison under the same load.
//
// BenchmarkPauseCross (cross_test.go) measures the same idle sandbox across two runners:
// resume on its own runner (the floor, same run), resume on the other runner (its
// checkpoint exported to the blob store and imported there), and fork ×1 onto the other
// runner; p50 and p99. Two runners do not fit `sandboxd dev`: it runs two stacks in its
// own process behind an in-process gateway, both with one SeaweedFS bucket as their blob
// store, so the gateway's and runners' CPU is the benchmark process's. It skips without
// SeaweedFS (`make seaweedfs`; SANDBOXD_REQUIRE_S3=1 makes that a failure).
package pausebench
