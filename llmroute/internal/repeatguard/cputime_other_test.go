//go:build !unix

package repeatguard

import "time"

func cpuTime() time.Duration { return 0 }
