//go:build unix

package repeatguard

import (
	"syscall"
	"time"
)

// cpuTime is the process's user+system CPU time: on a shared machine a
// benchmark's wall time includes time spent descheduled.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
