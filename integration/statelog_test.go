package integration

import "testing"

// TestSharedStateReachableIsInfo: a healthy start under state redis logs
// that the shared state is reachable at INFO, not WARN; only its loss is
// worth an operator's attention.
func TestSharedStateReachableIsInfo(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	p := startProxy(t, fleetConfig(up, rs.addr, 1))
	waitHealthy(t, p, true)
	entries := p.logEntries("shared state reachable, using it")
	if len(entries) == 0 {
		t.Fatal("no log entry says the shared state is reachable")
	}
	for _, e := range entries {
		if e["level"] != "info" {
			t.Errorf("%q logged at %v, want info", e["msg"], e["level"])
		}
	}
}
