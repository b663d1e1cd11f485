package edgebench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on Linux.
const clockTick = 10 * time.Millisecond

// processCPU is the CPU time (user + system) pid has used so far. On a machine shared
// with other work a throughput figure moves with the neighbours' load; CPU per request
// moves much less, so the benchmark reports both.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after "(comm)": state is field 3, utime 14 and stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad CPU times %q %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * clockTick, nil
}
