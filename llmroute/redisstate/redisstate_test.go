package redisstate

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
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

// pauseRedis makes redis-server answer no client for d (CLIENT PAUSE ALL);
// the end of the test lifts the pause.
func pauseRedis(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	if err := c.Do(context.Background(), "CLIENT", "PAUSE", strconv.FormatInt(d.Milliseconds(), 10), "ALL").Err(); err != nil {
		_ = c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Do(context.Background(), "CLIENT", "UNPAUSE")
		_ = c.Close()
	})
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
// a claim and a release, one script each, one after the other (the latency
// a request pays). Besides ns/op it reports what the server counted:
// script calls (EVALSHA/EVAL), round trips (pipelines the batcher sent)
// and redis-server CPU per op.
func BenchmarkClaimRelease(b *testing.B) {
	addr := startRedis(b)
	s := open(addr, "bench", 30*time.Second)
	defer s.Close()
	ctx := context.Background()
	m := meterServer(b, addr, s)
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
	b.StopTimer()
	m.report(b)
}

// BenchmarkClaimReleaseParallel is the same from 16 goroutines sharing one
// store (its connection pool), as concurrent requests of one instance do:
// ns/op is then the inverse of the throughput.
func BenchmarkClaimReleaseParallel(b *testing.B) {
	addr := startRedis(b)
	s := open(addr, "bench", 30*time.Second)
	defer s.Close()
	ctx := context.Background()
	m := meterServer(b, addr, s)
	b.ReportAllocs()
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if v, err := s.Claim(ctx, "u", "p", -1, -1); err != nil || v != Claimed {
				b.Error(v, err)
				return
			}
			if err := s.Release(ctx, "u", "p"); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	m.report(b)
}

// serverMeter reads what redis-server itself counted over a benchmark:
// script calls (INFO commandstats) and its CPU time (/proc).
type serverMeter struct {
	c            *redis.Client
	pid          string
	trips0, cpu0 int64
	s            *Store
	pipes0       int64
}

// meterServer starts counting after one claim and release through s, which
// load the scripts (a first EVALSHA fails with NOSCRIPT and is sent again
// as EVAL): the counts are then those of the steady state.
func meterServer(b *testing.B, addr string, s *Store) *serverMeter {
	b.Helper()
	if _, err := s.Claim(context.Background(), "u", "p", -1, -1); err != nil {
		b.Fatal(err)
	}
	if err := s.Release(context.Background(), "u", "p"); err != nil {
		b.Fatal(err)
	}
	m := &serverMeter{c: redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})}
	b.Cleanup(func() { _ = m.c.Close() })
	info, err := m.c.Info(context.Background(), "server").Result()
	if err != nil {
		b.Fatal(err)
	}
	m.pid = infoField(info, "process_id")
	m.trips0, m.cpu0 = m.scripts(b), m.cpuTicks(b)
	m.s, m.pipes0 = s, s.b.sent.Load()
	return m
}

// report adds round-trips/op and redis-cpu-ns/op to the benchmark's line.
func (m *serverMeter) report(b *testing.B) {
	b.Helper()
	trips, ticks := m.scripts(b)-m.trips0, m.cpuTicks(b)-m.cpu0
	b.ReportMetric(float64(trips)/float64(b.N), "scripts/op")
	// The batcher's pipelines: the round trips really made.
	b.ReportMetric(float64(m.s.b.sent.Load()-m.pipes0)/float64(b.N), "round-trips/op")
	// USER_HZ is 100 on Linux: a tick is 10 ms.
	b.ReportMetric(float64(ticks)*1e7/float64(b.N), "redis-cpu-ns/op")
}

// scripts is the number of EVALSHA and EVAL calls the server has run.
func (m *serverMeter) scripts(b *testing.B) int64 {
	b.Helper()
	info, err := m.c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, name := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		if v := infoField(info, name); v != "" {
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			k, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				b.Fatalf("%s: %q", name, v)
			}
			n += k
		}
	}
	return n
}

// cpuTicks is redis-server's utime+stime in clock ticks.
func (m *serverMeter) cpuTicks(b *testing.B) int64 {
	b.Helper()
	raw, err := os.ReadFile("/proc/" + m.pid + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // state is f[0], utime f[11], stime f[12]
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%s/stat: %q", m.pid, s)
	}
	return ut + st
}

// infoField returns the value of "name:value" in an INFO answer.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// TestClaimLeavesLiveLeaseToRenewal: a claim by an instance that holds
// slots already leaves its lease (the renewals push it on); one that holds
// none writes it and the keys' expiry, so the keys never lack one.
func TestClaimLeavesLiveLeaseToRenewal(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a, b := open(addr, "a", 10*time.Second), open(addr, "b", 10*time.Second)
	defer a.Close()
	defer b.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	keys := []string{"x:up:u", "x:up:u:leases", "x:prov:p", "x:prov:p:leases"}
	check := func(step string) {
		t.Helper()
		for _, k := range keys {
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil || ttl <= 0 || ttl > 20*time.Second {
				t.Fatalf("%s: %s expires in %v (%v), want (0, 20s]", step, k, ttl, err)
			}
		}
	}
	lease := func() float64 {
		t.Helper()
		v, err := c.ZScore(ctx, "x:up:u:leases", "a").Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	claim := func(s *Store) {
		t.Helper()
		if v, err := s.Claim(ctx, "u", "p", -1, -1); err != nil || v != Claimed {
			t.Fatal(v, err)
		}
	}
	claim(a)
	check("a's first claim")
	first := lease()
	time.Sleep(20 * time.Millisecond) // a lease written again would move on
	claim(b)
	check("b's first claim")
	claim(a)
	if got := lease(); got != first {
		t.Fatalf("a claim with a live lease moved it: %v → %v", first, got)
	}
	for range 2 {
		if err := a.Release(ctx, "u", "p"); err != nil {
			t.Fatal(err)
		}
	}
	claim(a) // a holds nothing: its lease is written anew
	if got := lease(); got <= first {
		t.Fatalf("a claim holding nothing left the lease at %v (was %v)", got, first)
	}
	check("a's claim after its releases")
	if err := b.Release(ctx, "u", "p"); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, "u", "p"); err != nil {
		t.Fatal(err)
	}
	claim(b) // the hash is gone: created again, with its expiry
	check("a claim on a new hash")
}
