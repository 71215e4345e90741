package gemini

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// recorded is one request of testdata/gemini-cli-0.61.0.generatecontent.json.
type recorded struct {
	URL  string          `json:"url"`
	Body json.RawMessage `json:"body"`
}

// recordedCLI reads the requests Gemini CLI 0.61.0 sent (a classifier call,
// then two streamed turns).
func recordedCLI(tb testing.TB) []recorded {
	tb.Helper()
	b, err := os.ReadFile("testdata/gemini-cli-0.61.0.generatecontent.json")
	if err != nil {
		tb.Fatal(err)
	}
	var f struct{ Requests []recorded }
	if err := json.Unmarshal(b, &f); err != nil || len(f.Requests) != 3 {
		tb.Fatalf("sample: %v, %d requests", err, len(f.Requests))
	}
	// The file is indented for reading; the CLI sends compact JSON.
	for i := range f.Requests {
		var c bytes.Buffer
		if err := json.Compact(&c, f.Requests[i].Body); err != nil {
			tb.Fatal(err)
		}
		f.Requests[i].Body = c.Bytes()
	}
	return f.Requests
}

// urlTarget splits /v1beta/models/{model}:{method}?… as the core does.
func urlTarget(tb testing.TB, url string) (model string, stream bool) {
	rest, ok := strings.CutPrefix(url, "/v1beta/models/")
	i := strings.LastIndexByte(rest, ':')
	if !ok || i < 0 {
		tb.Fatalf("url %q", url)
	}
	return rest[:i], strings.HasPrefix(rest[i+1:], "streamGenerateContent")
}

type chatReq struct {
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Type     string
		Function struct {
			Name       string
			Parameters json.RawMessage
		}
	} `json:"tools"`
	ResponseFormat *struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
	ReasoningEffort string          `json:"reasoning_effort"`
	Stream          bool            `json:"stream"`
	StreamOptions   json.RawMessage `json:"stream_options"`
	Model           *string         `json:"model"`
}

// What a chat upstream receives for the recorded Gemini CLI requests: one
// system message first, the 15 tools with their parametersJsonSchema as
// parameters, tool messages answering the assistant's call ids, no thought
// signature anywhere, upper-case schema types lower-cased.
func TestRecordedCLIRequests(t *testing.T) {
	reqs := recordedCLI(t)
	for i, rq := range reqs {
		model, stream := urlTarget(t, rq.URL)
		out, info, err := ToChat(nil, rq.Body, Options{ReasoningField: "reasoning_content", Model: model, Stream: stream})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		var c chatReq
		if err := json.Unmarshal(out, &c); err != nil {
			t.Fatalf("request %d: %v\n%s", i, err, out)
		}
		if bytes.Contains(out, []byte("thoughtSignature")) || bytes.Contains(out, []byte("elided: 112")) {
			t.Errorf("request %d: a thought signature reaches the upstream", i)
		}
		if c.Model != nil {
			t.Errorf("request %d: ToChat wrote a model (the core adds it)", i)
		}
		systems := 0
		for j, m := range c.Messages {
			if m.Role == "system" {
				systems++
				if j != 0 {
					t.Errorf("request %d: system message at %d", i, j)
				}
			}
		}
		if systems != 1 {
			t.Errorf("request %d: %d system messages, want 1", i, systems)
		}
		if info.Model != model || info.Stream != stream || !info.IncludeThoughts {
			t.Errorf("request %d: info %+v", i, info)
		}
		if c.ReasoningEffort != "high" {
			t.Errorf("request %d: reasoning_effort %q, want high (thinkingLevel HIGH)", i, c.ReasoningEffort)
		}
		if i == 0 {
			// The classifier: JSON mode with upper-case OpenAPI types.
			if c.ResponseFormat == nil || c.ResponseFormat.Type != "json_schema" || c.Stream || c.StreamOptions != nil {
				t.Fatalf("classifier: %s", out)
			}
			want := `{"type":"object","properties":{"complexity_reasoning":{"type":"string","description":"Brief explanation for the score."},"complexity_score":{"type":"integer","description":"Complexity score from 1-100."}},"required":["complexity_reasoning","complexity_score"]}`
			if got := string(c.ResponseFormat.JSONSchema.Schema); got != want {
				t.Errorf("classifier schema\n got %s\nwant %s", got, want)
			}
			if len(c.Messages) != 3 || c.Tools != nil {
				t.Errorf("classifier: %d messages, tools %v", len(c.Messages), c.Tools)
			}
			continue
		}
		if !c.Stream || string(c.StreamOptions) != `{"include_usage":true}` {
			t.Errorf("request %d: stream %v, stream_options %s", i, c.Stream, c.StreamOptions)
		}
		// The tools: parameters equal to the declarations' parametersJsonSchema.
		var src struct {
			Tools []struct {
				FunctionDeclarations []struct {
					Name                 string
					ParametersJsonSchema json.RawMessage `json:"parametersJsonSchema"`
				} `json:"functionDeclarations"`
			} `json:"tools"`
		}
		if err := json.Unmarshal(rq.Body, &src); err != nil || len(src.Tools) != 1 {
			t.Fatal(err)
		}
		decls := src.Tools[0].FunctionDeclarations
		if len(decls) != 15 || len(c.Tools) != 15 {
			t.Fatalf("request %d: %d declarations, %d tools; want 15", i, len(decls), len(c.Tools))
		}
		for j, d := range decls {
			tl := c.Tools[j]
			var a, b any
			json.Unmarshal(d.ParametersJsonSchema, &a)
			json.Unmarshal(tl.Function.Parameters, &b)
			if tl.Type != "function" || tl.Function.Name != d.Name || !reflect.DeepEqual(a, b) {
				t.Errorf("request %d tool %d: %s %s\n got %s\nwant %s", i, j, tl.Type, tl.Function.Name, tl.Function.Parameters, d.ParametersJsonSchema)
			}
		}
		// Tool messages answer the assistant's calls, ids kept.
		calls := map[string]bool{}
		tools := 0
		for _, m := range c.Messages {
			for _, tc := range m.ToolCalls {
				calls[tc.ID] = true
			}
			if m.Role == "tool" {
				tools++
				if !calls[m.ToolCallID] {
					t.Errorf("request %d: tool message %q answers no earlier call", i, m.ToolCallID)
				}
			}
		}
		if i == 2 {
			want := "write_file_1796525615012_0"
			var asst, tool int = -1, -1
			for j, m := range c.Messages {
				if m.Role == "assistant" {
					asst = j
				}
				if m.Role == "tool" {
					tool = j
				}
			}
			if asst < 0 || tool != asst+1 || tools != 1 || len(c.Messages[asst].ToolCalls) != 1 {
				t.Fatalf("turn 2 messages: %s", out)
			}
			a, tm := c.Messages[asst], c.Messages[tool]
			if a.ToolCalls[0].ID != want || tm.ToolCallID != want || a.ToolCalls[0].Function.Name != "write_file" {
				t.Errorf("turn 2 ids: call %q, tool message %q; want %q", a.ToolCalls[0].ID, tm.ToolCallID, want)
			}
			if string(a.Content) != `"I will create the file."` || string(tm.Content) != `"<elided: 141 chars>"` {
				t.Errorf("turn 2 contents: %s / %s", a.Content, tm.Content)
			}
			var args map[string]string
			if err := json.Unmarshal([]byte(a.ToolCalls[0].Function.Arguments), &args); err != nil || args["content"] != "HELLO-cc1aaa01" {
				t.Errorf("turn 2 arguments %q: %v", a.ToolCalls[0].Function.Arguments, err)
			}
		}
	}
}
