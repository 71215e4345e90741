package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Modes of the fake upstream, chosen per request by the modeHeader request
// header (both proxies forward client headers unchanged).
const (
	modeNonStream = "nonstream" // one ~600 B chat.completion
	// modeRouter: the non-stream request to the router model (routerModel):
	// what a rule costs on top of a plain model.
	modeRouter = "router"
	modeStream = "stream" // 24 chunk events + [DONE], no delay
	modePaced  = "paced"  // think time, then 24 events apart
	modeThink  = "think"  // like stream, <think> tags split across chunks
	// modeGuard: the stream request to a model with repeat_guard on
	// (clientGuardModel): what watching for loops costs on a stream
	// without one.
	modeGuard = "guard"

	modeHeader = "X-Bench-Mode"
	// echoHeader is the response header where the fake upstream echoes the
	// `model` it received, so the client can check what the proxy sent.
	echoHeader = "X-Echo-Model"
)

// streamEvents is the number of data events (before [DONE]) of every stream.
const streamEvents = 24

// payloads holds every body of the benchmark, encoded once at start-up.
type payloads struct {
	// Client request bodies (model "bench" or "bench-think").
	reqNonStream, reqStream, reqThink, reqRouter, reqGuard []byte

	// Upstream response bodies.
	completion  []byte   // non-stream body
	events      [][]byte // the 24 data events then the [DONE] event
	thinkEvents [][]byte // the same with <think> split across chunks
	streamBody  []byte   // events joined: what a passthrough client must see
	thinkBody   []byte   // thinkEvents joined

	// What a think_tags split client must reassemble from the deltas.
	thinkContent, thinkReasoning string

	fr *frontPayloads // the Messages and Responses scenarios (fronts.go)
}

// Client-visible model names and the real names llm_route must send upstream.
const (
	clientModel      = "bench"
	clientThinkModel = "bench-think"
	// routerModel is a router model with one catch-all rule whose chain is
	// clientModel's, asked for with an effort suffix.
	routerModel = "auto:medium"
	// clientGuardModel is clientModel's upstream with repeat_guard on.
	clientGuardModel = "bench-guard"
	realModel        = "real-model"
	realThinkModel   = "think-model"
)

const systemPrompt = "You are a careful senior software engineer helping a colleague review " +
	"a change to a production HTTP service. Answer precisely, cite the relevant lines, " +
	"prefer small concrete suggestions over rewrites, and say so plainly when you are not " +
	"sure. Keep answers short unless asked for detail. Use Markdown for code. Never invent " +
	"APIs; if a function is not shown, ask for it instead of guessing its behaviour. When " +
	"numbers are involved, say how they were measured, on what machine, and how noisy they " +
	"are; a benchmark without a baseline from the same run is an anecdote, not a result."

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRequest struct {
	Model       string    `json:"model"`
	Messages    []message `json:"messages"`
	Stream      bool      `json:"stream"`
	Temperature float64   `json:"temperature"`
	MaxTokens   int       `json:"max_tokens"`
	User        string    `json:"user"`
}

// newPayloads builds and encodes every body.
func newPayloads() *payloads {
	p := &payloads{}
	req := func(model string, stream bool) []byte {
		b, err := json.Marshal(chatRequest{
			Model: model,
			Messages: []message{
				{"system", systemPrompt},
				{"user", "Here is the handler's hot path. It reads the request body into a pooled " +
					"buffer, parses the model, claims a slot and proxies. Is there an obvious " +
					"allocation we could avoid per request?"},
				{"assistant", "Two candidates: the header clone for the outgoing request and the " +
					"per-request timer for the first-byte watchdog. Can you show me how the " +
					"transport is configured, in particular the idle connection pool size?"},
				{"user", "MaxIdleConnsPerHost is 1024, IdleConnTimeout two minutes, HTTP/1.1 only, " +
					"no compression. Under 64 concurrent clients we see about 9k requests per " +
					"second on one core, and the p99 latency doubles when we turn on think_tags " +
					"for streams. What would you measure next, and how?"},
			},
			Stream:      stream,
			Temperature: 0.2,
			MaxTokens:   512,
			User:        "loadbench",
		})
		if err != nil {
			panic(err)
		}
		return b
	}
	p.reqNonStream = req(clientModel, false)
	p.reqRouter = req(routerModel, false)
	p.reqStream = req(clientModel, true)
	p.reqThink = req(clientThinkModel, true)
	p.reqGuard = req(clientGuardModel, true)

	p.completion = []byte(`{"id":"chatcmpl-loadbench-0001","object":"chat.completion","created":1700000000,` +
		`"model":"upstream-model","system_fingerprint":"fp_loadbench","choices":[{"index":0,"message":` +
		`{"role":"assistant","content":"Measure before changing anything: take a CPU profile under the ` +
		`same load, then look at allocations per request. The header clone is cheap next to JSON ` +
		`work. If the profile shows syscalls on top, the cost is in the network stack, so batching ` +
		`writes would help more than anything in the handler."},"logprobs":null,"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":312,"completion_tokens":86,"total_tokens":398}}` + "\n")

	words := strings.Fields("Measure first: profile the proxy under the same load, compare the " +
		"allocation views, and only then change the hot path, one thing at a time, re-running.")
	plain := make([]string, streamEvents-2)
	for i := range plain {
		w := words[i%len(words)]
		if i > 0 {
			w = " " + w
		}
		plain[i] = w
	}
	p.events = chunkEvents(plain)
	p.streamBody = join(p.events)
	p.fr = newFrontPayloads(plain)

	// The think stream: both tags are cut in two, in different places, and
	// the reasoning spans several chunks.
	think := []string{"<th", "ink>Let", " me", " think", " about", " the", " hot", " path", ".",
		" The", " answer", " is", " to", " measure.</", "think>", "\n\nMeasure", " first", ",",
		" then", " change", " one", " thing."}
	if len(think) != streamEvents-2 {
		panic(fmt.Sprintf("think pieces: %d", len(think)))
	}
	p.thinkEvents = chunkEvents(think)
	p.thinkBody = join(p.thinkEvents)
	p.thinkContent, p.thinkReasoning = splitThink(strings.Join(think, ""))
	return p
}

// chunkEvents encodes a role event, one content event per piece, a finish
// event and [DONE]: len(pieces)+2 data events plus [DONE].
func chunkEvents(pieces []string) [][]byte {
	const head = `data: {"id":"chatcmpl-loadbench-0001","object":"chat.completion.chunk","created":1700000000,` +
		`"model":"upstream-model","system_fingerprint":"fp_loadbench","choices":[{"index":0,"delta":`
	evs := [][]byte{[]byte(head + `{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")}
	for _, s := range pieces {
		c, _ := json.Marshal(s)
		evs = append(evs, []byte(head+`{"content":`+string(c)+`},"logprobs":null,"finish_reason":null}]}`+"\n\n"))
	}
	evs = append(evs, []byte(head+`{},"logprobs":null,"finish_reason":"stop"}]}`+"\n\n"))
	evs = append(evs, []byte("data: [DONE]\n\n"))
	return evs
}

func join(evs [][]byte) []byte {
	var b []byte
	for _, e := range evs {
		b = append(b, e...)
	}
	return b
}

// splitThink is the reference think_tags split of a whole text: the text of
// <think>…</think> blocks is reasoning, the rest content.
func splitThink(s string) (content, reasoning string) {
	var c, r strings.Builder
	for {
		i := strings.Index(s, "<think>")
		if i < 0 {
			c.WriteString(s)
			return c.String(), r.String()
		}
		c.WriteString(s[:i])
		s = s[i+len("<think>"):]
		j := strings.Index(s, "</think>")
		if j < 0 {
			r.WriteString(s)
			return c.String(), r.String()
		}
		r.WriteString(s[:j])
		s = s[j+len("</think>"):]
	}
}
