// Package edgebench measures internal/edge against HAProxy doing the same jobs on
// loopback, in one run: HTTPS-terminating requests/s over keep-alive connections, TLS
// passthrough throughput, and new TLS connections/s. It prints each figure and the
// ratio edge/HAProxy (target ≥ 0.9), and each proxy's CPU time per unit of work, which
// moves less than throughput with the load of other work on a shared machine. The edge
// runs in a process of its own, as HAProxy does. Run it with scripts/bench-edge.sh, or
//
//	go test ./bench/edge -run '^$' -bench . -benchtime 1x
//
// EDGE_BENCH_DURATION (default 3s) is how long each target is measured per figure, in
// five alternating rounds of which the median counts; the -benchtime count does not
// change the measurement. EDGE_BENCH_CPUPROFILE=<file> writes the edge process's CPU
// profile. Without haproxy on PATH the benchmarks skip.
package edgebench
