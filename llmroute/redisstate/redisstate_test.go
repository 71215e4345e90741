package redisstate

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startRedis runs a redis-server of the test's own (no persistence) and
// returns its address. Missing, it fails: .ci/run installs it.
func startRedis(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed (apt-get install redis-server; .ci/run does it)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr
}

func open(addr, instance string, ttl time.Duration) *Store {
	return Open(Options{Address: addr, Prefix: "x:", Timeout: time.Second, LeaseTTL: ttl}, instance)
}

func TestClaimLimitsCapacityExpiryAndRenew(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a, b := open(addr, "a", time.Second), open(addr, "b", time.Second)
	defer a.Close()
	defer b.Close()

	claim := func(s *Store, up string, want Verdict) {
		t.Helper()
		v, err := s.Claim(ctx, up, "p", 2, 3)
		if err != nil || v != want {
			t.Fatalf("claim %s: %v, %v; want %v", up, v, err, want)
		}
	}
	// The upstream limit is fleet-wide.
	claim(a, "u1", Claimed)
	claim(b, "u1", Claimed)
	claim(a, "u1", UpstreamFull)
	// The provider capacity counts every upstream of it.
	claim(b, "u2", Claimed)
	claim(a, "u2", ProviderFull)
	if err := a.Release(ctx, "u1", "p"); err != nil {
		t.Fatal(err)
	}
	claim(a, "u2", Claimed)
	ups, provs, err := a.Used(ctx, []string{"u1", "u2"}, []string{"p"})
	if err != nil || ups["u1"] != 1 || ups["u2"] != 2 || provs["p"] != 3 {
		t.Fatalf("used = %v %v %v, want u1 1, u2 2, p 3", ups, provs, err)
	}

	// b stops renewing (a crash): its leases expire, a's are renewed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := a.Renew(ctx, map[string]int64{"u1": 0, "u2": 1}, map[string]int64{"p": 1}); err != nil {
			t.Fatal(err)
		}
		ups, provs, _ = a.Used(ctx, []string{"u1", "u2"}, []string{"p"})
		if ups["u1"] == 0 && ups["u2"] == 1 && provs["p"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's leases did not expire: %v %v", ups, provs)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// State lost (a restart): the next renewal writes a's holding back.
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Renew(ctx, map[string]int64{"u2": 1}, map[string]int64{"p": 1}); err != nil {
		t.Fatal(err)
	}
	ups, provs, _ = a.Used(ctx, []string{"u2"}, []string{"p"})
	if ups["u2"] != 1 || provs["p"] != 1 {
		t.Fatalf("after a flush and a renewal: %v %v, want u2 1, p 1", ups, provs)
	}
}

func TestBackoffDoublesOnTheServer(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a, b := open(addr, "a", time.Second), open(addr, "b", time.Second)
	defer a.Close()
	defer b.Close()
	var lefts []time.Duration
	for i, s := range []*Store{a, b, a, b} { // failures on either instance count in one streak
		c, err := s.Fail(ctx, "provider/p", 4*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		if c.Streak != int64(i+1) {
			t.Fatalf("streak = %d, want %d", c.Streak, i+1)
		}
		lefts = append(lefts, c.Left)
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		if lefts[i] < want-50*time.Millisecond || lefts[i] > want {
			t.Errorf("cooling after failure %d = %v, want %v (doubling, capped at 4s)", i+1, lefts[i], want)
		}
	}
	if hold, err := a.Succeed(ctx, "provider/p"); err != nil || hold != 0 {
		t.Fatalf("success: hold %v, %v", hold, err)
	}
	if c, _ := b.Fail(ctx, "provider/p", 4*time.Second, 0); c.Streak != 1 || c.Left > time.Second {
		t.Errorf("after a success the streak starts over: %+v", c)
	}
	// A Retry-After hold survives a success.
	if _, err := a.Fail(ctx, "upstream/u", time.Minute, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if hold, _ := b.Succeed(ctx, "upstream/u"); hold < 2*time.Second {
		t.Errorf("hold left after a success = %v, want about 3s", hold)
	}
}

// BenchmarkClaimRelease is one request's round trips against a live Redis:
// a claim and a release, one script each.
func BenchmarkClaimRelease(b *testing.B) {
	addr := startRedis(b)
	s := open(addr, "bench", 30*time.Second)
	defer s.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if v, err := s.Claim(ctx, "u", "p", 64, -1); err != nil || v != Claimed {
			b.Fatal(v, err)
		}
		if err := s.Release(ctx, "u", "p"); err != nil {
			b.Fatal(err)
		}
	}
}
