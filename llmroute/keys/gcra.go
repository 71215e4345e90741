package keys

import "time"

// GCRA (the Generic Cell Rate Algorithm, ITU-T I.371; the "virtual
// scheduling" form) keeps one number per key, the theoretical arrival time
// (TAT) of the next request if requests came exactly at the rate. A request
// at now is admitted when now ≥ TAT − τ, τ = (burst−1)·T being how far
// ahead of schedule a client may run (T = 1 min / rpm); admitting it moves
// TAT to max(TAT, now) + T. This is a token bucket without a refill timer
// or a float: one integer per key, one compare and one add per request,
// which is also exactly what a Redis script can do in one atomic step
//. Written here rather than imported: it is a dozen lines, and
// the small libraries that offer it (throttled, go-redis/redis_rate) bring
// their own stores.

// gcraInterval is T, the emission interval of r, in nanoseconds.
func gcraInterval(r Rate) int64 {
	return int64(time.Minute) / r.PerMinute
}

// gcra applies one request at now (unix nanos) to the stored TAT. It
// returns the new TAT when the request is admitted, else the unchanged TAT
// and how long until it would be.
func gcra(tat, now int64, r Rate) (newTAT int64, ok bool, retryAfter time.Duration) {
	t := gcraInterval(r)
	burst := max(r.Burst, 1)
	tau := (burst - 1) * t
	if tat < now {
		tat = now // idle time earns no more than the burst
	}
	if allowAt := tat - tau; now < allowAt {
		return tat, false, time.Duration(allowAt - now)
	}
	return tat + t, true, 0
}
