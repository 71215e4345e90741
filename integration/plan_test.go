package integration

// POST /llm_route/plan and `caddy llm-route plan`: what a config change
// would do to the running router, asked of a real Caddy with requests in
// flight and a cooling upstream; nothing is applied.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Secrets of the plan tests: none may appear in a plan or the CLI's output.
const (
	planKeyOld   = "sk-test-secret-plan-old"
	planKeyNew   = "sk-test-secret-plan-new"
	planClient   = "ck-test-secret-plan-team"
	planClient2  = "ck-test-secret-plan-team2"
	planRedisPwd = "pw-test-secret-plan-redis"
	planURLPwd   = "pw-test-secret-plan-url"
)

type planRig struct {
	p       *proxy
	gate    *gate
	busy    *fakeUpstream
	handler map[string]any
	running []<-chan result
}

// startPlanRig runs a router with two requests held on "busy" and "flaky"
// cooling for 120 s (a 429 with Retry-After).
func startPlanRig(t *testing.T) *planRig {
	t.Helper()
	r := &planRig{gate: newGate()}
	r.busy = newUpstream(t, r.gate.handler(completion("held answer")))
	flaky := newUpstream(t, status(429, "Retry-After", "120"))
	spare := newUpstream(t, nil)
	r.handler = cfg(
		[]map[string]any{
			obj("id", "p-busy", "url", r.busy.base(), "key", planKeyOld),
			obj("id", "p-flaky", "url", flaky.base(), "backoff", "5m", "probe_interval", "0s"),
			obj("id", "p-spare", "url", spare.base()),
		},
		[]map[string]any{
			obj("id", "busy", "provider", "p-busy", "model", "real-busy", "max_concurrency", 4),
			obj("id", "flaky", "provider", "p-flaky", "model", "real-flaky"),
			obj("id", "spare", "provider", "p-spare", "model", "real-spare"),
		},
		[]map[string]any{
			obj("name", "chat", "upstreams", []string{"busy", "spare"}),
			obj("name", "flaky", "upstreams", []string{"flaky"}),
			obj("name", "other", "upstreams", []string{"spare"}),
		},
		"keys", []map[string]any{obj("id", "team", "secret", planClient, "tokens_per_day", 100000)},
	)
	r.p = startProxy(t, r.handler)
	t.Cleanup(r.gate.open)
	if resp := r.p.chat(chatBody("flaky", false), "Authorization", "Bearer "+planClient); readAll(t, resp) == "" ||
		resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("flaky request: status %d, want 503", resp.StatusCode)
	}
	for range 2 {
		r.running = append(r.running, r.p.goChat(context.Background(), chatBody("chat", false), "Authorization", "Bearer "+planClient))
	}
	r.gate.waitArrivals(t, 2)
	return r
}

// candidate is the running handler config with edit applied to a deep copy.
func (r *planRig) candidate(t *testing.T, edit func(h map[string]any)) []byte {
	t.Helper()
	b, _ := json.Marshal(r.handler)
	var h map[string]any
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(h)
	}
	return r.p.config(h)
}

// entry returns the entry of the handler's list whose key field is id.
func entry(h map[string]any, list, key, id string) map[string]any {
	for _, e := range h[list].([]any) {
		if m := e.(map[string]any); m[key] == id {
			return m
		}
	}
	return nil
}

// planAnswer is the JSON of a plan, as far as the tests read it.
type planAnswer struct {
	Handlers []struct {
		Path    string       `json:"path"`
		Op      string       `json:"op"`
		Changes []planChange `json:"changes"`
		State   []planCarry  `json:"state"`
		Notes   []string     `json:"notes"`
	} `json:"handlers"`
	Valid bool `json:"valid"`
}

type planChange struct {
	Kind   string `json:"kind"`
	ID     string `json:"id"`
	Op     string `json:"op"`
	Note   string `json:"note"`
	Fields []struct {
		Path   string `json:"path"`
		Old    any    `json:"old"`
		New    any    `json:"new"`
		Secret bool   `json:"secret"`
	} `json:"fields"`
}

type planCarry struct {
	Upstream       string  `json:"upstream"`
	Op             string  `json:"op"`
	CarriesOver    bool    `json:"carries_over"`
	Inflight       int64   `json:"inflight"`
	CoolingSeconds float64 `json:"cooling_seconds"`
	Queued         int     `json:"queued"`
	Note           string  `json:"note"`
}

// postAdmin posts body to an admin path and returns the status and body.
func postAdmin(t *testing.T, p *proxy, path, contentType string, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.admin+path, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// plan asks for the plan of a candidate config and decodes it.
func (r *planRig) plan(t *testing.T, candidate []byte) (planAnswer, string) {
	t.Helper()
	code, body := postAdmin(t, r.p, "/llm_route/plan", "", candidate)
	if code != http.StatusOK {
		t.Fatalf("plan: status %d: %s", code, body)
	}
	var a planAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("plan answer: %v: %s", err, body)
	}
	if !a.Valid || len(a.Handlers) != 1 {
		t.Fatalf("plan: want one handler and valid: %s", body)
	}
	return a, body
}

// changeOf finds a change by kind and id.
func changeOf(a planAnswer, kind, id string) (int, bool) {
	i := slices.IndexFunc(a.Handlers[0].Changes, func(c planChange) bool { return c.Kind == kind && c.ID == id })
	return i, i >= 0
}

// liveState is what a plan must leave as it was: the running config and
// every upstream's slots, limit, cooling and fail streak.
func (r *planRig) liveState(t *testing.T) (string, string) {
	t.Helper()
	resp, err := testClient.Get(r.p.admin + "/config/")
	if err != nil {
		t.Fatal(err)
	}
	cfgBody := readAll(t, resp)
	resp, err = testClient.Get(r.p.admin + "/llm_route/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Upstreams []struct {
			ID             string  `json:"id"`
			Inflight       int64   `json:"inflight"`
			Limit          *int64  `json:"limit"`
			CoolingSeconds float64 `json:"cooling_seconds"`
			CoolingReason  *string `json:"cooling_reason"`
			FailStreak     int64   `json:"fail_streak"`
		} `json:"upstreams"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &st); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, u := range st.Upstreams {
		lim := "∞"
		if u.Limit != nil {
			lim = strconv.FormatInt(*u.Limit, 10)
		}
		reason := "-"
		if u.CoolingReason != nil {
			reason = *u.CoolingReason
		}
		// Cooling counts down; a plan must neither end nor restart it.
		cooling := "no"
		if u.CoolingSeconds > 60 {
			cooling = "yes"
		}
		fmt.Fprintf(&b, "%s inflight=%d limit=%s cooling=%s(%s) streak=%d\n", u.ID, u.Inflight, lim, cooling, reason, u.FailStreak)
	}
	return cfgBody, b.String()
}

func TestPlanConfigChanges(t *testing.T) {
	r := startPlanRig(t)
	cfgBefore, stateBefore := r.liveState(t)
	if !strings.Contains(stateBefore, "busy inflight=2 limit=4") || !strings.Contains(stateBefore, "flaky inflight=0 limit=∞ cooling=yes(retry_after)") {
		t.Fatalf("the rig is not as planned:\n%s", stateBefore)
	}

	// The same config: nothing changes, everything carries over.
	a, body := r.plan(t, r.candidate(t, nil))
	if len(a.Handlers[0].Changes) != 0 {
		t.Errorf("unchanged config: want no changes: %s", body)
	}
	for _, s := range a.Handlers[0].State {
		if !s.CarriesOver || s.Op != "kept" {
			t.Errorf("unchanged config: %s should carry over: %s", s.Upstream, body)
		}
		switch s.Upstream {
		case "busy":
			if s.Inflight != 2 {
				t.Errorf("busy: inflight %d, want 2: %s", s.Inflight, body)
			}
		case "flaky":
			if s.CoolingSeconds < 60 {
				t.Errorf("flaky: cooling %v, want about 120 s: %s", s.CoolingSeconds, body)
			}
		}
	}

	t.Run("rename an upstream", func(t *testing.T) {
		a, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			entry(h, "upstreams", "id", "spare")["id"] = "spare2"
			entry(h, "models", "name", "chat")["upstreams"] = []string{"busy", "spare2"}
			entry(h, "models", "name", "other")["upstreams"] = []string{"spare2"}
		}))
		for _, want := range [][2]string{{"spare", "removed"}, {"spare2", "added"}} {
			i, ok := changeOf(a, "upstream", want[0])
			if !ok || a.Handlers[0].Changes[i].Op != want[1] {
				t.Errorf("upstream %s: want %s: %s", want[0], want[1], body)
			}
		}
		if i, ok := changeOf(a, "model", "chat"); !ok || !strings.Contains(a.Handlers[0].Changes[i].Note, "busy, spare → busy, spare2") {
			t.Errorf("model chat: want its chain change noted: %s", body)
		}
	})

	t.Run("remove an upstream with two in flight", func(t *testing.T) {
		a, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			h["upstreams"] = slices.DeleteFunc(h["upstreams"].([]any), func(e any) bool { return e.(map[string]any)["id"] == "busy" })
			h["providers"] = slices.DeleteFunc(h["providers"].([]any), func(e any) bool { return e.(map[string]any)["id"] == "p-busy" })
			entry(h, "models", "name", "chat")["upstreams"] = []string{"spare"}
		}))
		i := slices.IndexFunc(a.Handlers[0].State, func(s planCarry) bool { return s.Upstream == "busy" })
		if i < 0 {
			t.Fatalf("no state for busy: %s", body)
		}
		s := a.Handlers[0].State[i]
		if s.Op != "removed" || s.CarriesOver || s.Inflight != 2 || s.Note != "2 in flight will drain here" {
			t.Errorf("busy: want removed with 2 in flight draining, got %+v: %s", s, body)
		}
		if i, ok := changeOf(a, "model", "chat"); !ok || a.Handlers[0].Changes[i].Note != "its chain changes: busy, spare → spare" {
			t.Errorf("model chat: want its chain change: %s", body)
		}
	})

	t.Run("change a model's chain", func(t *testing.T) {
		a, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			entry(h, "models", "name", "other")["upstreams"] = []string{"spare", "busy"}
		}))
		i, ok := changeOf(a, "model", "other")
		if !ok {
			t.Fatalf("no change of model other: %s", body)
		}
		c := a.Handlers[0].Changes[i]
		if c.Op != "changed" || len(c.Fields) != 1 || c.Fields[0].Path != "upstreams" ||
			!reflect.DeepEqual(c.Fields[0].Old, []any{"spare"}) || !reflect.DeepEqual(c.Fields[0].New, []any{"spare", "busy"}) ||
			c.Note != "its chain changes: spare → spare, busy" {
			t.Errorf("model other: got %+v: %s", c, body)
		}
	})

	t.Run("change a key's budget", func(t *testing.T) {
		a, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			entry(h, "keys", "id", "team")["tokens_per_day"] = 250000
		}))
		i, ok := changeOf(a, "key", "team")
		if !ok {
			t.Fatalf("no change of key team: %s", body)
		}
		c := a.Handlers[0].Changes[i]
		if len(c.Fields) != 1 || c.Fields[0].Path != "tokens_per_day" || c.Fields[0].Old != 100000.0 || c.Fields[0].New != 250000.0 ||
			c.Note != "its limits change; its counters carry over" {
			t.Errorf("key team: got %+v: %s", c, body)
		}
	})

	t.Run("switch state to redis", func(t *testing.T) {
		a, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			h["state"] = obj("backend", "redis", "address", "127.0.0.1:1", "password", planRedisPwd)
		}))
		i, ok := changeOf(a, "state", "")
		if !ok || a.Handlers[0].Changes[i].Note != "a new fleet starts; the old one drains" {
			t.Fatalf("state: want a new fleet: %s", body)
		}
		if !slices.Contains(a.Handlers[0].Notes, "state: a new fleet starts; the old one drains") {
			t.Errorf("handler notes lack the fleet: %s", body)
		}
		for _, s := range a.Handlers[0].State {
			if s.CarriesOver {
				t.Errorf("%s: a new fleet counts its slots afresh: %s", s.Upstream, body)
			}
		}
		if strings.Contains(body, planRedisPwd) {
			t.Errorf("the redis password is in the plan: %s", body)
		}
	})

	t.Run("change secrets", func(t *testing.T) {
		a, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			entry(h, "providers", "id", "p-busy")["key"] = planKeyNew
			entry(h, "keys", "id", "team")["secret"] = planClient2
			spare := entry(h, "providers", "id", "p-spare")
			spare["url"] = strings.Replace(spare["url"].(string), "http://", "http://user:"+planURLPwd+"@", 1)
		}))
		if i, ok := changeOf(a, "provider", "p-spare"); !ok || !strings.Contains(body, "http://redacted@127.0.0.1") {
			t.Errorf("provider p-spare: want its url changed, credentials redacted (%d): %s", i, body)
		}
		for _, kc := range [][3]string{{"provider", "p-busy", "key"}, {"key", "team", "secret"}} {
			i, ok := changeOf(a, kc[0], kc[1])
			if !ok {
				t.Fatalf("no change of %s %s: %s", kc[0], kc[1], body)
			}
			f := a.Handlers[0].Changes[i].Fields
			if len(f) != 1 || f[0].Path != kc[2] || !f[0].Secret || f[0].Old != "[redacted]" || f[0].New != "[redacted]" {
				t.Errorf("%s %s: want %s changed as a secret: %s", kc[0], kc[1], kc[2], body)
			}
		}
		for _, s := range []string{planKeyOld, planKeyNew, planClient, planClient2, planURLPwd} {
			if strings.Contains(body, s) {
				t.Errorf("a secret is in the plan: %s", body)
			}
		}
	})

	t.Run("lower a limit", func(t *testing.T) {
		// Provisioning the candidate must not apply its limits to the
		// running router (checked with the live state below).
		a, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			entry(h, "upstreams", "id", "busy")["max_concurrency"] = 1
		}))
		i, ok := changeOf(a, "upstream", "busy")
		if !ok || a.Handlers[0].Changes[i].Fields[0].Path != "max_concurrency" {
			t.Errorf("upstream busy: want max_concurrency changed: %s", body)
		}
	})

	// The candidates' names left no series behind. (Checked before the
	// failed /load below: Caddy's admin endpoint then serves the metrics
	// registry of the config that failed.)
	if m := r.p.metrics(); strings.Contains(m, `"spare2"`) || !strings.Contains(m, `upstream="busy"`) {
		t.Errorf("the metrics show a candidate's upstream, or lost the running ones:\n%s", m)
	}

	t.Run("invalid", func(t *testing.T) {
		bad := r.candidate(t, func(h map[string]any) {
			entry(h, "models", "name", "other")["upstreams"] = []string{"nowhere"}
		})
		code, planBody := postAdmin(t, r.p, "/llm_route/plan", "", bad)
		loadCode, loadBody := postAdmin(t, r.p, "/load", "", bad)
		if code != http.StatusBadRequest || loadCode != http.StatusBadRequest || planBody != loadBody {
			t.Errorf("invalid: plan %d %s\nwant /load's %d %s", code, planBody, loadCode, loadBody)
		}
		if !strings.Contains(planBody, `unknown upstream or pool \"nowhere\"`) {
			t.Errorf("invalid: the message does not say what is wrong: %s", planBody)
		}
		// Not JSON at all, and an unknown field: the same messages as /load.
		// (The admin block stays: /load replaces the admin endpoint before
		// it provisions the apps.)
		unknown := r.candidate(t, func(h map[string]any) { entry(h, "upstreams", "id", "spare")["nope"] = 1 })
		for _, b := range [][]byte{[]byte(`{"apps":`), unknown} {
			code, planBody = postAdmin(t, r.p, "/llm_route/plan", "", b)
			loadCode, loadBody = postAdmin(t, r.p, "/load", "", b)
			if code != http.StatusBadRequest || code != loadCode || planBody != loadBody {
				t.Errorf("invalid %s: plan %d %s\nwant /load's %d %s", b, code, planBody, loadCode, loadBody)
			}
		}
	})

	// PLAN_EXAMPLE=dir saves a plan with requests in flight, for the docs.
	if os.Getenv("PLAN_EXAMPLE") != "" {
		_, body := r.plan(t, r.candidate(t, func(h map[string]any) {
			entry(h, "upstreams", "id", "spare")["id"] = "spare2"
			entry(h, "models", "name", "other")["upstreams"] = []string{"spare2"}
			entry(h, "models", "name", "chat")["upstreams"] = []string{"busy", "spare2"}
			entry(h, "providers", "id", "p-busy")["key"] = planKeyNew
		}))
		_ = os.WriteFile(filepath.Join(os.Getenv("PLAN_EXAMPLE"), "plan.json"), []byte(body), 0o644)
	}

	// Nothing was applied: the same config, the same live state, and
	// requests are still served.
	cfgAfter, stateAfter := r.liveState(t)
	if cfgAfter != cfgBefore {
		t.Errorf("the running config changed:\n%s\nwas\n%s", cfgAfter, cfgBefore)
	}
	if stateAfter != stateBefore {
		t.Errorf("the live state changed:\n%s\nwas\n%s", stateAfter, stateBefore)
	}
	if resp := r.p.chat(chatBody("other", false), "Authorization", "Bearer "+planClient); resp.StatusCode != http.StatusOK {
		t.Errorf("after the plans: status %d: %s", resp.StatusCode, readAll(t, resp))
	}
	r.gate.open()
	for _, ch := range r.running {
		if res := await(t, ch); res.status != http.StatusOK {
			t.Errorf("a request in flight during the plans: status %d: %s", res.status, res.body)
		}
	}
}

// exitStatus is the process exit status caddy's main would give err.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	// caddycmd's exit error carries the status in an ExitCode field.
	if v := reflect.ValueOf(err); v.Kind() == reflect.Pointer && v.Elem().Kind() == reflect.Struct {
		if f := v.Elem().FieldByName("ExitCode"); f.IsValid() {
			return int(f.Int())
		}
	}
	return 1
}

func TestPlanCLI(t *testing.T) {
	r := startPlanRig(t)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	same := write("same.json", r.candidate(t, nil))
	changed := write("changed.json", r.candidate(t, func(h map[string]any) {
		entry(h, "providers", "id", "p-busy")["key"] = planKeyNew
		h["upstreams"] = slices.DeleteFunc(h["upstreams"].([]any), func(e any) bool { return e.(map[string]any)["id"] == "busy" })
		entry(h, "models", "name", "chat")["upstreams"] = []string{"spare"}
		entry(h, "keys", "id", "team")["tokens_per_day"] = 5
	}))
	invalid := write("invalid.json", r.candidate(t, func(h map[string]any) {
		entry(h, "models", "name", "other")["upstreams"] = []string{"nowhere"}
	}))

	// The admin address comes from the candidate's admin block, as caddy
	// reload finds it.
	out, err := runCLI(t, "plan", "--config", same)
	if exitStatus(err) != 0 || !strings.Contains(out, "no changes") || !strings.Contains(out, "changes nothing") {
		t.Errorf("same config: exit %d (%v), want 0:\n%s", exitStatus(err), err, out)
	}

	out, err = runCLI(t, "plan", "--config", changed)
	if exitStatus(err) != 1 {
		t.Errorf("changed config: exit %d (%v), want 1:\n%s", exitStatus(err), err, out)
	}
	for _, want := range []string{"provider p-busy changed", "key: changed (secret, not shown)", "upstream busy removed",
		"model chat changed: its chain changes: busy, spare → spare", `upstreams: ["busy","spare"] → ["spare"]`,
		"key team changed: its limits change; its counters carry over", "tokens_per_day: 100000 → 5",
		"UPSTREAM", "CARRIES OVER", "2 in flight will drain here", "loading this config changes the router"} {
		if !strings.Contains(out, want) {
			t.Errorf("changed config: the output lacks %q:\n%s", want, out)
		}
	}
	if column(out, "  UPSTREAM", "IN FLIGHT") != column(out, "  busy ", "2 ") {
		t.Errorf("the state table is not aligned:\n%s", out)
	}
	for _, s := range []string{planKeyOld, planKeyNew, planClient} {
		if strings.Contains(out, s) || err != nil && strings.Contains(err.Error(), s) {
			t.Errorf("a secret is in the CLI output:\n%s", out)
		}
	}

	out, err = runCLI(t, "plan", "--config", invalid, "--address", strings.TrimPrefix(r.p.admin, "http://"))
	if exitStatus(err) != 2 || !strings.Contains(err.Error(), `unknown upstream or pool "nowhere"`) {
		t.Errorf("invalid config: exit %d (%v), want 2 and /load's message:\n%s", exitStatus(err), err, out)
	}
	out, err = runCLI(t, "plan", "--config", filepath.Join(dir, "missing.json"))
	if exitStatus(err) != 2 {
		t.Errorf("missing file: exit %d (%v), want 2:\n%s", exitStatus(err), err, out)
	}
	r.gate.open()
}

// A Caddyfile posted as text/caddyfile is adapted first, as /load does,
// and its llm_route is matched with the running one; a Caddyfile that does
// not adapt gets the adapter's message.
func TestPlanCaddyfile(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 2))
	caddyfile := fmt.Sprintf(`{
	admin %s
}
:%d {
	llm_route {
		provider p {
			url %s
		}
		upstream u p real-model {
			max_concurrency 3
		}
		model m u
	}
}
`, strings.TrimPrefix(p.admin, "http://"), p.port, up.base())
	code, body := postAdmin(t, p, "/llm_route/plan", "text/caddyfile", []byte(caddyfile))
	if code != http.StatusOK {
		t.Fatalf("plan: %d %s", code, body)
	}
	var a planAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil || len(a.Handlers) != 1 || a.Handlers[0].Op != "" {
		t.Fatalf("plan: want the one handler matched: %v %s", err, body)
	}
	t.Log(body)
	code, body = postAdmin(t, p, "/llm_route/plan", "text/caddyfile", []byte(":1 {\n\tllm_route {\n\t\tbogus\n\t}\n}\n"))
	_, loadBody := postAdmin(t, p, "/adapt", "text/caddyfile", []byte(":1 {\n\tllm_route {\n\t\tbogus\n\t}\n}\n"))
	if code != http.StatusBadRequest || !strings.Contains(body, "adapting config using caddyfile adapter") || !strings.Contains(loadBody, "bogus") {
		t.Errorf("bad Caddyfile: %d %s (adapt: %s)", code, body, loadBody)
	}
}

// Checking a candidate provisions its logs; Caddy's own log must keep
// going where the running config sends it, not to the candidate's file.
func TestPlanKeepsTheRunningLog(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 2))
	var c map[string]any
	if err := json.Unmarshal(p.config(basicConfig(up, 3)), &c); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "candidate.log")
	c["logging"] = obj("logs", obj("default", obj("level", "DEBUG", "writer", obj("output", "file", "filename", other))))
	candidate, _ := json.Marshal(c)
	if code, body := postAdmin(t, p, "/llm_route/plan", "", candidate); code != http.StatusOK {
		t.Fatalf("plan: %d %s", code, body)
	}
	resp, err := testClient.Get(p.admin + "/config/apps/http/servers/srv0/listen?after-plan")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	eventually(t, 5*time.Second, "the admin request after the plan in the running log", func() bool {
		return strings.Contains(p.logs(), "after-plan")
	})
	if b, _ := os.ReadFile(other); strings.Contains(string(b), "after-plan") {
		t.Errorf("Caddy's log went to the candidate's file:\n%s", b)
	}
}
