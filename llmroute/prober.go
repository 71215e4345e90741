package llmroute

import (
	"context"
	"runtime/debug"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The prober brings cooling upstreams back early: for each upstream in
// backoff, every probe_interval, it sends the tiny streaming request
// (provider and upstream patches applied) outside the slot accounting. 2xx
// plus a first body byte within first_byte_timeout ends the cooling at once;
// an upstream that serves no chat is probed in an API it serves (probeFor);
// a failed probe changes nothing. One prober runs per handler instance and
// stops in Cleanup; its results live in the pooled state, so a reload loses
// nothing.

// minProbeTick bounds how often the prober looks at the upstreams.
const minProbeTick = 50 * time.Millisecond

// anthropicVersion is the anthropic-version header of a Messages probe
// (clients send their own; the probe has none to forward).
const anthropicVersion = "2023-06-01"

// probeTimeoutFallback bounds a probe of an upstream whose first-byte
// watchdog is disabled.
const probeTimeoutFallback = 30 * time.Second

func (h *Handler) runProber() {
	defer close(h.proberDone)
	defer func() {
		if p := recover(); p != nil {
			h.logger.Error("prober panicked", zap.Any("error", p), zap.ByteString("stack", debug.Stack()))
		}
	}()
	var probed []*upstream
	tick := time.Duration(0)
	for _, uc := range h.Upstreams {
		u := h.table.upstreams[uc.ID]
		if u.probeInterval <= 0 || u.Backoff == nil {
			continue
		}
		probed = append(probed, u)
		if tick == 0 || u.probeInterval < tick {
			tick = u.probeInterval
		}
	}
	if len(probed) == 0 {
		return
	}
	tick = max(tick/4, minProbeTick)

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	busy := make(map[*upstream]bool, len(probed))
	lastProbe := make(map[*upstream]time.Time, len(probed))
	var mu sync.Mutex // guards busy

	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for {
		select {
		case <-h.stopProber:
			return
		case <-ctx.Done():
			return
		case now := <-ticker.C:
			for _, u := range probed {
				if !u.Backoff.ProbeDue(now, u.probeInterval) || now.Sub(lastProbe[u]) < u.probeInterval {
					continue
				}
				mu.Lock()
				if busy[u] {
					mu.Unlock()
					continue
				}
				busy[u] = true
				mu.Unlock()
				lastProbe[u] = now
				wg.Add(1)
				go func(u *upstream) {
					defer wg.Done()
					defer func() {
						mu.Lock()
						busy[u] = false
						mu.Unlock()
					}()
					h.probe(ctx, u)
				}(u)
			}
		}
	}
}

// probe sends one probe and records its outcome.
func (h *Handler) probe(parent context.Context, u *upstream) {
	defer func() {
		if p := recover(); p != nil {
			h.logger.Error("probe panicked", zap.Any("error", p), zap.ByteString("stack", debug.Stack()))
		}
	}()
	timeout := u.firstByte
	if timeout <= 0 {
		timeout = min(h.requestTimeout, probeTimeoutFallback)
		if timeout <= 0 {
			timeout = probeTimeoutFallback
		}
	}
	ok, status := h.sendProbe(parent, u, timeout)
	if parent.Err() != nil {
		return // shutting down: not a verdict
	}
	result := "fail"
	if ok {
		result = "ok"
		u.recordSuccess(time.Now())
		sched.dispatch() // waiting requests may use it now
		if c := h.logger.Check(zapcore.InfoLevel, "probe answered, upstream back in the pool"); c != nil {
			c.Write(zap.String("upstream", u.ID), zap.String("provider", u.Provider))
		}
	} else if c := h.logger.Check(zapcore.InfoLevel, "probe failed, upstream stays cooling"); c != nil {
		c.Write(zap.String("upstream", u.ID), zap.String("provider", u.Provider), zap.Int("status", status))
	}
	h.metrics.probes.WithLabelValues(u.ID, u.Provider, result).Inc()
	u.State.NoteProbe(result, time.Now())
}

// sendProbe reports whether the upstream answered 2xx and sent a first body
// byte within timeout. It goes through the attempt path (call.go) with the
// first-byte window set to timeout; its failures change nothing, so the
// call's own log lines are left out (probe logs the verdict).
func (h *Handler) sendProbe(ctx context.Context, u *upstream, timeout time.Duration) (bool, int) {
	// A transport module may read placeholders (e.g. a tls_server_name with
	// one) from the request's replacer; requests of clients carry Caddy's.
	ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer())
	c := call{h: h, u: u, log: nopLogger, stream: true, firstByte: timeout}
	c.open(context.WithCancel(ctx))
	defer c.close() // without draining: the rest of the answer is of no interest
	req := c.request(u.urls[u.probeEP], u.probeBody)
	if u.probeEP != epEmbeddings {
		req.Header.Set("Accept", "text/event-stream")
	}
	if u.probeEP == epMessages {
		// Anthropic's API refuses a request without a version.
		req.Header.Set("Anthropic-Version", anthropicVersion)
	}
	res, ok := c.send(req)
	if !ok {
		return false, res.status
	}
	st := c.resp.StatusCode
	return st >= 200 && st <= 299 && len(c.first) > 0, st
}
