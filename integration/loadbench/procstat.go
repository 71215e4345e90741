package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime/stime in /proc/PID/stat (USER_HZ).
var clockTick = func() time.Duration {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if hz, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && hz > 0 {
			return time.Second / time.Duration(hz)
		}
	}
	return 10 * time.Millisecond // USER_HZ is 100 on every mainstream Linux
}()

// procCPU returns the user+system CPU time a process has used so far, from
// utime and stime of /proc/PID/stat ("self" for this process). Its
// resolution is one clock tick (usually 10 ms), so measurement windows must
// be long enough to burn hundreds of ticks.
func procCPU(pid string) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields resume after
	// the last ')'. Field 3 (state) is then index 0, utime (14) index 11.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%s/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// procStatusKB returns a "kB" field of /proc/PID/status, e.g. VmHWM (peak
// resident set size over the process lifetime) or VmRSS.
func procStatusKB(pid, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%s/status: no %s", pid, field)
}

// cpusAllowed returns the Cpus_allowed_list of a process, e.g. "0" or
// "0-1", or "?" when it cannot be read.
func cpusAllowed(pid string) string {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return "?"
}

// loadAvg returns the 1-minute load average and the number of online CPUs as
// "1.23 on 2 CPUs", to show in the report how busy the machine was.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return fmt.Sprintf("%s on %d CPUs", f[0], runtimeNumCPUOnline())
}

// runtimeNumCPUOnline counts the machine's online CPUs (not only those this
// process may use).
func runtimeNumCPUOnline() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0
	}
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		if !isRange {
			if err1 == nil {
				n++
			}
			continue
		}
		z, err2 := strconv.Atoi(hi)
		if err1 == nil && err2 == nil && z >= a {
			n += z - a + 1
		}
	}
	return n
}
