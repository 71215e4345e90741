package integration

// The llm_route_status handler on an ordinary site: headless Chromium
// opens the page straight from the site (no proxy to the admin endpoint),
// the site's basic_auth protects a second mount, the JSON answers equal the
// admin API's, and after a burst of traffic (successes, a failing upstream,
// a budgeted key with spend, a pool) the charts show the failures and the
// spend. The screenshot is kept under /tmp/llm_route_screens.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"
)

// screensDir keeps the screenshots after the test (t.TempDir is removed).
const screensDir = "/tmp/llm_route_screens"

const statusKeySecret = "sk-status-billing-0001"

// startStatusSite loads, from a Caddyfile, a site with llm_route, the
// status handler under /llm-status/ and again under /private/ behind
// basic_auth (user ops, password pw-ops).
func startStatusSite(t *testing.T, good, bad *fakeUpstream) *proxy {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("pw-ops"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, port: freePort(t), aport: freePort(t)}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	p.admin = fmt.Sprintf("http://127.0.0.1:%d", p.aport)
	p.logPath = filepath.Join(t.TempDir(), "caddy.log")
	src := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	storage file_system %s
	auto_https off
}

http://127.0.0.1:%d {
	handle_path /llm-status/* {
		llm_route_status
	}
	handle_path /mon* {
		llm_route_status
	}
	handle_path /private/* {
		basic_auth {
			ops %s
		}
		llm_route_status
	}
	llm_route {
		provider p-good {
			url %s
		}
		provider p-bad {
			url %s
		}
		upstream good p-good real-good {
			max_concurrency 4
			price_input 5000
			price_output 20000
		}
		upstream bad p-bad real-bad
		upstream pa p-good real-a
		upstream pb p-good real-b
		pool pair {
			upstreams pa pb
			placement least_busy
		}
		model chat bad good
		model pooled pair
		key billing {
			secret %s
			spend_per_day 1
			spend_per_month 4
		}
	}
}
`, p.aport, t.TempDir(), p.port, hash, good.base(), bad.base(), statusKeySecret)
	cfgJSON, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("adapting: %s", w.String())
	}
	if err := loadCaddy(t, cfgJSON); err != nil {
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping caddy: %v", err)
		}
	})
	return p
}

// getJSON fetches url (with basic auth when user is set) and decodes it.
func getJSON(t *testing.T, url string, user ...string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(user) == 2 {
		req.SetBasicAuth(user[0], user[1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body := readAll(t, resp)
	var v map[string]any
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("GET %s: %v: %s", url, err, body)
		}
	}
	return resp.StatusCode, v
}

func TestStatusHandlerOnASiteInHeadlessChromium(t *testing.T) {
	browser := chromiumPath(t)
	good := newUpstream(t, completion("fine"))
	bad := newUpstream(t, status(500))
	p := startStatusSite(t, good, bad)

	// The site's basic_auth protects the second mount.
	if st, _ := getJSON(t, p.URL+"/private/status"); st != http.StatusUnauthorized {
		t.Errorf("/private/status without credentials: %d, want 401", st)
	}
	if st, _ := getJSON(t, p.URL+"/private/status", "ops", "wrong"); st != http.StatusUnauthorized {
		t.Errorf("/private/status with a wrong password: %d, want 401", st)
	}
	if st, v := getJSON(t, p.URL+"/private/status", "ops", "pw-ops"); st != http.StatusOK || len(v["upstreams"].([]any)) != 4 {
		t.Errorf("/private/status with credentials: %d %v, want 200 and 4 upstreams", st, v)
	}

	// Mounted without the slash: the page's address gets one, so that its
	// relative URLs resolve under the mount.
	noFollow := &http.Client{Transport: testClient.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if resp, err := noFollow.Get(p.URL + "/mon"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "/mon/" {
		t.Errorf("GET /mon: %d to %q, want 308 to /mon/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if st, v := getJSON(t, p.URL+"/mon/status"); st != http.StatusOK || len(v["upstreams"].([]any)) != 4 {
		t.Errorf("GET /mon/status: %d, want the status", st)
	}
	if st, _ := getJSON(t, p.URL+"/llm-status/nothing-here"); st != http.StatusNotFound {
		t.Errorf("GET /llm-status/nothing-here: %d, want 404", st)
	}

	// A burst of traffic within a bucket or two: every chat request fails
	// on bad (500) and is answered by good, charged to the key.
	const chats, pooled = 6, 4
	body := func(model string) string {
		return `{"model":"` + model + `","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	}
	for i := range chats + pooled {
		model := "chat"
		if i >= chats {
			model = "pooled"
		}
		resp := p.chat(body(model), "Authorization", "Bearer "+statusKeySecret)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s request %d: %d %s", model, i, resp.StatusCode, b)
		}
	}

	// The handler's JSON answers are the admin API's (but for the clock).
	for _, path := range []string{"status", "explain?model=chat", "explain?model=pooled&session=s1"} {
		_, site := getJSON(t, p.URL+"/llm-status/"+path)
		_, admin := getJSON(t, p.admin+"/llm_route/"+path)
		delete(site, "now")
		delete(admin, "now")
		if !reflect.DeepEqual(site, admin) {
			a, _ := json.Marshal(admin)
			s, _ := json.Marshal(site)
			t.Errorf("%s differs:\nadmin %s\nsite  %s", path, a, s)
		}
	}
	_, st := getJSON(t, p.URL+"/llm-status/status")
	key := st["keys"].([]any)[0].(map[string]any)
	spentDay, limitDay := key["spend_today_usd"].(float64), key["spend_per_day"].(float64)
	spentMonth, limitMonth := key["spend_month_usd"].(float64), key["spend_per_month"].(float64)
	if spentDay <= 0 || spentDay >= limitDay {
		t.Fatalf("the key spent $%v of $%v today; the test needs a part of the budget", spentDay, limitDay)
	}
	// The history, on both: the failures on bad, the key's requests.
	_, hist := getJSON(t, p.URL+"/llm-status/history")
	_, adminHist := getJSON(t, p.admin+"/llm_route/history")
	for _, h := range []map[string]any{hist, adminHist} {
		var failed float64
		for _, u := range h["upstreams"].([]any) {
			if u := u.(map[string]any); u["id"] == "bad" {
				for _, n := range u["requests"].(map[string]any)["5xx"].([]any) {
					failed += n.(float64)
				}
			}
		}
		if failed != chats {
			t.Errorf("history: bad's 5xx over the window = %v, want %d", failed, chats)
		}
	}

	ctx, _ := startChromium(t, browser)
	open := func(url string) int64 {
		t.Helper()
		c, done := context.WithTimeout(ctx, 30*time.Second)
		defer done()
		resp, err := chromedp.Run(c, chromedp.NavigateResponse(url))
		if err != nil {
			t.Fatalf("opening %s: %v", url, err)
		}
		return resp.Status
	}
	poll := func(what, js string) {
		t.Helper()
		c, done := context.WithTimeout(ctx, 30*time.Second)
		defer done()
		if _, err := chromedp.Run(c, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(20*time.Second),
			chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(js string, out any) {
		t.Helper()
		c, done := context.WithTimeout(ctx, 30*time.Second)
		defer done()
		v, err := chromedp.Run(c, chromedp.Evaluate[json.RawMessage](js))
		if err != nil {
			t.Fatalf("evaluating %s: %v", js, err)
		}
		if err := json.Unmarshal(v, out); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
	}

	if st := open(p.URL + "/llm-status/"); st != http.StatusOK {
		t.Fatalf("the browser opened /llm-status/: HTTP %d, want 200", st)
	}
	poll("the upstream table", `document.querySelectorAll("#upstreams tbody tr[data-upstream]").length === 4`)
	poll("the page's refresh", `document.getElementById("updated").dataset.live === "true"`)
	poll("the charts", `document.getElementById("history").dataset.drawn === "true"`)

	var rows []string
	eval(`[...document.querySelectorAll("#upstreams tbody tr")].map(r => r.dataset.upstream)`, &rows)
	if got := strings.Join(rows, " "); got != "good bad pa pb" {
		t.Errorf("upstream rows = %q, want good bad pa pb", got)
	}

	// bad's requests chart: failure-coloured bars, as many failures as sent.
	var fails struct {
		N      int     `json:"n"`
		Sum    int     `json:"sum"`
		Height float64 `json:"height"`
		Fill   string  `json:"fill"`
	}
	eval(`(() => {
		const rs = [...document.querySelectorAll('svg.requests[data-upstream="bad"] rect.c-fail')];
		return {n: rs.length, sum: rs.reduce((s, r) => s + Number(r.dataset.value), 0),
			height: rs.reduce((s, r) => s + Number(r.getAttribute("height")), 0),
			fill: rs.length ? getComputedStyle(rs[0]).fill : ""};
	})()`, &fails)
	if fails.N == 0 || fails.Sum != chats || fails.Height <= 0 {
		t.Errorf("bad's failure bars: %+v, want bars of non-zero height summing to %d failures", fails, chats)
	}
	if fails.Fill != "rgb(213, 0, 0)" {
		t.Errorf("failure bars are filled %q, want the failure red rgb(213, 0, 0)", fails.Fill)
	}
	var goodFails, goodOK int
	eval(`document.querySelectorAll('svg.requests[data-upstream="good"] rect.c-fail').length`, &goodFails)
	eval(`document.querySelectorAll('svg.requests[data-upstream="good"] rect.c-ok').length`, &goodOK)
	if goodFails != 0 || goodOK == 0 {
		t.Errorf("good's chart: %d failure bars, %d ok bars; want none and some", goodFails, goodOK)
	}

	// The key's budget bars are filled by the spend's share.
	var bars map[string]float64
	eval(`(() => {
		const out = {};
		for (const s of document.querySelectorAll('tr[data-key="billing"] svg.budget')) {
			const f = s.querySelector("rect.fill");
			out[s.dataset.period] = f ? Number(f.getAttribute("width")) / Number(s.getAttribute("width")) : -1;
		}
		return out;
	})()`, &bars)
	for period, want := range map[string]float64{"day": spentDay / limitDay, "month": spentMonth / limitMonth} {
		if got, ok := bars[period]; !ok || math.Abs(got-want) > 0.01 {
			t.Errorf("the key's %s bar is filled %.4f, want %.4f (spend / budget); bars %v", period, got, want, bars)
		}
	}
	// The pool's placements.
	var placed int
	eval(`[...document.querySelectorAll('tr[data-pool="pair"] svg.placements rect[data-value]')].reduce((s, r) => s + Number(r.dataset.value), 0)`, &placed)
	if placed != pooled {
		t.Errorf("the pool's placement bars count %d, want %d", placed, pooled)
	}

	c, done := context.WithTimeout(ctx, 30*time.Second)
	defer done()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(screensDir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(screensDir, "status-handler-history.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	// Behind basic_auth: headless Chromium fails the navigation that
	// answers 401 (there is nobody to ask for a password) ...
	c2, done2 := context.WithTimeout(ctx, 30*time.Second)
	defer done2()
	if _, err := chromedp.Run(c2, chromedp.NavigateResponse(p.URL+"/private/")); err == nil || !strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS") {
		t.Errorf("the browser opened /private/ without credentials: %v, want the 401's ERR_INVALID_AUTH_CREDENTIALS", err)
	}
	// ... and with the credentials on every request the page and its
	// refreshes are served.
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:pw-ops"))
	if err := chromedp.Do(c2, chromedp.Func(func(c context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(c, tg, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(c, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}})
		return err
	})); err != nil {
		t.Fatalf("setting the credentials: %v", err)
	}
	if st := open(p.URL + "/private/"); st != http.StatusOK {
		t.Fatalf("the browser opened /private/ with credentials: HTTP %d, want 200", st)
	}
	poll("the protected page's upstream table", `document.querySelectorAll("#upstreams tbody tr[data-upstream]").length === 4`)
	poll("the protected page's refresh", `document.getElementById("updated").dataset.live === "true"`)
	poll("the protected page's charts", `document.getElementById("history").dataset.drawn === "true"`)
}

// The history outlives a reload that keeps the ids, and `caddy llm-route
// status --watch` draws it.
func TestStatusHistoryAcrossReloadAndWatch(t *testing.T) {
	good := newUpstream(t, completion("fine"))
	bad := newUpstream(t, status(500))
	handler := func(extra ...map[string]any) map[string]any {
		return cfg(
			[]map[string]any{obj("id", "p-good", "url", good.base()), obj("id", "p-bad", "url", bad.base())},
			[]map[string]any{obj("id", "good", "provider", "p-good", "model", "real-good", "price_input", 5000.0, "price_output", 20000.0),
				obj("id", "bad", "provider", "p-bad", "model", "real-bad")},
			append([]map[string]any{obj("name", "chat", "upstreams", []string{"bad", "good"})}, extra...),
			"keys", []any{obj("id", "billing", "secret", statusKeySecret, "spend_per_day", 1.0)})
	}
	p := startProxy(t, handler())
	const n = 3
	for i := range n {
		resp := p.chat(`{"model":"chat","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer "+statusKeySecret)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	// A reload that keeps every id (and adds a model).
	p.load(handler(obj("name", "other", "upstreams", []string{"good"})))

	_, h := getJSON(t, p.admin+"/llm_route/history")
	total := func(kind, id, series string) (n float64) {
		for _, e := range h[kind].([]any) {
			e := e.(map[string]any)
			if e["id"] != id {
				continue
			}
			v := e[series]
			if m, ok := v.(map[string]any); ok { // requests by result
				v = m["5xx"]
				if id == "good" {
					v = m["ok"]
				}
			}
			xs, _ := v.([]any) // absent: nothing recorded
			for _, x := range xs {
				n += x.(float64)
			}
		}
		return n
	}
	if got := total("upstreams", "bad", "requests"); got != n {
		t.Errorf("after the reload, bad's 5xx in the history = %v, want %d", got, n)
	}
	if got := total("upstreams", "good", "requests"); got != n {
		t.Errorf("after the reload, good's ok in the history = %v, want %d", got, n)
	}
	if got := total("models", "chat", "output_tokens"); got != n {
		t.Errorf("after the reload, chat's output tokens = %v, want %d (one per answer)", got, n)
	}
	if got := total("keys", "billing", "served"); got != n {
		t.Errorf("after the reload, the key's served requests = %v, want %d", got, n)
	}
	if got := total("models", "other", "output_tokens"); got != 0 {
		t.Errorf("the new model's history has %v output tokens, want 0", got)
	}

	addr := strings.TrimPrefix(p.admin, "http://")
	out, err := runCLI(t, "status", "--watch", "--interval", "50ms", "--frames", "2", "--address", addr)
	if err != nil {
		t.Fatalf("status --watch: %v\n%s", err, out)
	}
	if c := strings.Count(out, "\x1b[H\x1b[2J"); c != 2 {
		t.Errorf("status --watch --frames 2 cleared the screen %d times, want 2:\n%s", c, out)
	}
	lineOf := func(prefix string) string { // in the last frame's history
		frame := out[strings.LastIndex(out, "LAST 15 MINUTES"):]
		for _, l := range strings.Split(frame, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		return ""
	}
	for _, want := range []string{"UPSTREAM", "LAST 15 MINUTES", "KEY", "every 50ms · Ctrl-C ends"} {
		if !strings.Contains(out, want) {
			t.Errorf("status --watch lacks %q:\n%s", want, out)
		}
	}
	if l := lineOf("bad  "); !strings.Contains(l, "\x1b[31m") || !strings.Contains(l, " 3\x1b[0m") {
		t.Errorf("bad's sparkline line does not show its 3 failures in red: %q\n%s", l, out)
	}
	if l := lineOf("billing"); !strings.Contains(l, "[") || !strings.Contains(l, "/$1") || !strings.Contains(l, "3 ok") {
		t.Errorf("the key's line = %q, want a spend bar of $1 and 3 ok", l)
	}
	t.Logf("status --watch, last frame:\n%s", out[strings.LastIndex(out, "\x1b[2J")+4:])
}
