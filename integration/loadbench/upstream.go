package main

import (
	"bytes"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// fakeUpstream is an OpenAI-compatible chat completions server that answers
// from pre-encoded bodies, so that per request it only reads the body, finds
// the model and writes bytes: it must never be the bottleneck.
//
// It serves only POST /v1/chat/completions (anything else is a 404, which the
// client reports as an error): that is the path both proxies must reach.
type fakeUpstream struct {
	p        *payloads
	srv      *http.Server
	ln       net.Listener
	url      string // http://127.0.0.1:port
	addr     string // 127.0.0.1:port
	think    time.Duration
	interval time.Duration

	conns    atomic.Int64 // TCP connections accepted
	requests atomic.Int64 // chat completions served
}

var (
	ctJSON       = []string{"application/json"}
	ctSSE        = []string{"text/event-stream"}
	noCache      = []string{"no-cache"}
	echoReal     = []string{realModel}
	echoThink    = []string{realThinkModel}
	echoClient   = []string{clientModel}
	echoClientTh = []string{clientThinkModel}
	echoClientMs = []string{clientMsgModel}
)

var bodyPool = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 4<<10)) }}

// startUpstream listens on a loopback port and serves until close.
func startUpstream(p *payloads, think, interval time.Duration) (*fakeUpstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &fakeUpstream{p: p, ln: ln, think: think, interval: interval}
	u.addr = ln.Addr().String()
	u.url = "http://" + u.addr
	u.srv = &http.Server{
		Handler:     u,
		IdleTimeout: 10 * time.Minute,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				u.conns.Add(1)
			}
		},
	}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

func (u *fakeUpstream) close() { _ = u.srv.Close() }

// ServeHTTP answers one chat completion according to the X-Bench-Mode
// request header, echoing the received model in X-Echo-Model.
func (u *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if r.Method == http.MethodGet && path == "/v1/models" {
		// The handler's start-up check of the provider url.
		h := w.Header()
		h["Content-Type"] = ctJSON
		_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
		return
	}
	gemini := path == geminiPath
	if r.Method != http.MethodPost || path != "/v1/chat/completions" && path != "/v1/messages" && path != "/v1/responses" && !gemini {
		http.Error(w, "fake upstream: only POST /v1/chat/completions, /v1/messages, /v1/responses, "+geminiPath, http.StatusNotFound)
		return
	}
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(r.Body)
	model := requestModel(buf.Bytes())
	if gemini {
		model = []byte(clientModel) // Google's API names the model in the path
	}
	bodyPool.Put(buf)
	if err != nil {
		return
	}
	u.requests.Add(1)

	h := w.Header()
	h[echoHeader] = echoValue(model)
	mode := r.Header.Get(modeHeader)
	completion, events := u.p.completion, u.p.events
	switch {
	case path == "/v1/messages":
		// A native Messages server (the translated scenarios reach it only
		// through reverse_proxy, which cannot translate).
		completion, events = u.p.fr.msgCompletion, u.p.fr.msgEvents
	case path == "/v1/responses":
		events = u.p.fr.respEvents
	case gemini:
		// A native Gemini server (reached only through reverse_proxy).
		events = u.p.fr.geminiEvents
	case mode == modeThink:
		events = u.p.thinkEvents
	}
	if mode == modeNonStream || mode == modeMsgNonStream || mode == modeRouter || mode == "" {
		h["Content-Type"] = ctJSON
		h["Content-Length"] = []string{strconv.Itoa(len(completion))}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(completion)
		return
	}

	h["Content-Type"] = ctSSE
	h["Cache-Control"] = noCache
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	paced := mode == modePaced
	if paced {
		// Headers go out at once, as real providers do; the first token
		// comes after the think time.
		fl.Flush()
		time.Sleep(u.think)
	}
	for i, ev := range events {
		if paced && i > 0 {
			time.Sleep(u.interval)
		}
		if _, err := w.Write(ev); err != nil {
			return
		}
		fl.Flush()
	}
}

// echoValue returns a shared header value for the known models.
func echoValue(model []byte) []string {
	switch string(model) {
	case realModel:
		return echoReal
	case realThinkModel:
		return echoThink
	case clientModel:
		return echoClient
	case clientThinkModel:
		return echoClientTh
	case clientMsgModel:
		return echoClientMs
	}
	return []string{string(model)}
}

// requestModel finds the top-level "model" string of a request body without
// decoding it (the benchmark's bodies have it as a plain, unescaped string).
func requestModel(b []byte) []byte {
	i := bytes.Index(b, []byte(`"model"`))
	if i < 0 {
		return nil
	}
	b = bytes.TrimLeft(b[i+len(`"model"`):], " \t\r\n")
	if len(b) == 0 || b[0] != ':' {
		return nil
	}
	b = bytes.TrimLeft(b[1:], " \t\r\n")
	if len(b) == 0 || b[0] != '"' {
		return nil
	}
	j := bytes.IndexByte(b[1:], '"')
	if j < 0 {
		return nil
	}
	return b[1 : 1+j]
}
