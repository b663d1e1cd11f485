// Package fssbench measures file-system snapshots end to end against a real `sandboxd
// dev` (the package starts one of its own, on loopback ports, bridge, subnet and cgroup
// parent of its own, from bin/sandboxd or $SANDBOXD_BIN), through the Go SDK:
//
//   - snapshot of a scratch volume holding 100 MiB and 1 GiB of random bytes: create →
//     READY (polled every 10 ms), next to two floors measured in the same run on the same
//     disk (the data dir's): a plain copy of the same bytes (+fsync), and tar | zstd -1 of
//     the same tree into a file (+fsync), which is the work an archive needs at least;
//   - restore of the 100 MiB snapshot into 1 and 20 sandboxes created at once: create → the
//     first exec of every one has read the restored file, next to the same sandboxes
//     without a restore;
//   - create → first exec with a restore served from the runner's cache vs without a
//     restore, alternating, one sandbox at a time (the restore's added ms).
//
// Targets (2-core machine) are printed next to the numbers: 100 MiB READY ≤ 1.5 s, cached
// restore adds ≤ 50 ms, workload pause ≤ 50 ms. The API does not report the pause: it is
// taken from the server's log line of the snapshot when the runner logs one (a field
// named pause), else reported as unavailable (the backend's own benchmark measures it).
//
// Run with `make bench` (full sizes) or, as `make bench-smoke` does, -benchtime 1x, which
// uses small sizes (4 and 16 MiB, 1 and 3 sandboxes) so that the flow is exercised in a
// few seconds. Needs root; without it the benchmarks skip.
package fssbench
