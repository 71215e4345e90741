package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func readSample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// toChat translates body and checks the result is valid JSON.
func toChat(t *testing.T, body string, opt Options) (string, *Info) {
	t.Helper()
	out, info, err := ToChat(nil, []byte(body), opt)
	if err != nil {
		t.Fatalf("ToChat: %v", err)
	}
	if !json.Valid(out) {
		t.Fatalf("ToChat output is not JSON: %s", out)
	}
	return string(out), info
}

// member returns the raw JSON of key in the object s.
func rawMember(t *testing.T, s, key string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return string(m[key])
}

func jsonEqual(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("got is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want is not JSON: %v\n%s", err, want)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("JSON differs\n got: %s\nwant: %s", got, want)
	}
}

// The recorded Claude Code turns: every part the chat upstream sees.
func TestToChatClaudeCodeSample(t *testing.T) {
	for _, tc := range []struct {
		file     string
		messages string
	}{
		{"claude-code-turn1.json", `[` +
			`{"role":"system","content":"You are a Claude agent, built on Anthropic's Claude Agent SDK.\n<elided: 6816 chars>"},` +
			`{"role":"user","content":"<elided: 576 chars>\ncreate hello.txt containing HELLO-58bc553a"},` +
			`{"role":"system","content":"<elided: 9143 chars>"}]`},
		{"claude-code-turn2.json", `[` +
			`{"role":"system","content":"You are a Claude agent, built on Anthropic's Claude Agent SDK.\n<elided: 6816 chars>"},` +
			`{"role":"user","content":"<elided: 576 chars>\ncreate hello.txt containing HELLO-58bc553a"},` +
			`{"role":"system","content":"<elided: 9143 chars>"},` +
			`{"role":"assistant","content":"I will create the file now.","tool_calls":[{"id":"toolu_01Fid58bc553a","type":"function","function":{"name":"Write","arguments":"{\"file_path\":\"<workdir>/hello.txt\",\"content\":\"HELLO-58bc553a\\n\"}"}}]},` +
			`{"role":"tool","tool_call_id":"toolu_01Fid58bc553a","content":"<elided: 151 chars>"}]`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			body := readSample(t, tc.file)
			out, info := toChat(t, string(body), Options{})
			if got := rawMember(t, out, "messages"); got != tc.messages {
				t.Errorf("messages\n got: %s\nwant: %s", got, tc.messages)
			}
			// Scalars in order, the thinking/context_management/output_config
			// fields dropped.
			var keys []string
			dec := json.NewDecoder(strings.NewReader(out))
			dec.Token()
			for dec.More() {
				k, _ := dec.Token()
				keys = append(keys, k.(string))
				var skip json.RawMessage
				dec.Decode(&skip)
			}
			wantKeys := []string{"model", "messages", "max_tokens", "user", "tools", "stream", "stream_options"}
			if !reflect.DeepEqual(keys, wantKeys) {
				t.Errorf("keys %v, want %v", keys, wantKeys)
			}
			for k, want := range map[string]string{
				"model":          `"local-coder"`,
				"max_tokens":     `32000`,
				"stream":         `true`,
				"stream_options": `{"include_usage":true}`,
				"user":           `"{\"device_id\":\"296041f4966e1a55be4e982b3505d11d7080b5ffd60d374271cbfb221c479d73\",\"account_uuid\":\"\",\"session_id\":\"3db1b303-ad53-4739-971b-c1cce7192a40\"}"`,
			} {
				if got := rawMember(t, out, k); got != want {
					t.Errorf("%s = %s, want %s", k, got, want)
				}
			}
			if *info != (Info{Model: "local-coder", Stream: true, Thinking: true}) {
				t.Errorf("info %+v", *info)
			}
			// Tools: each a function whose parameters are the input_schema
			// bytes as sent.
			var req struct {
				Tools []struct {
					Name        string          `json:"name"`
					Description string          `json:"description"`
					InputSchema json.RawMessage `json:"input_schema"`
				} `json:"tools"`
			}
			var chat struct {
				Tools []struct {
					Type     string `json:"type"`
					Function struct {
						Name        string          `json:"name"`
						Description string          `json:"description"`
						Parameters  json.RawMessage `json:"parameters"`
					} `json:"function"`
				} `json:"tools"`
			}
			json.Unmarshal(body, &req)
			json.Unmarshal([]byte(out), &chat)
			if len(chat.Tools) != 12 || len(req.Tools) != 12 {
				t.Fatalf("tools: %d translated of %d", len(chat.Tools), len(req.Tools))
			}
			for i, ct := range chat.Tools {
				rt := req.Tools[i]
				if ct.Type != "function" || ct.Function.Name != rt.Name || ct.Function.Description != rt.Description ||
					!bytes.Equal(ct.Function.Parameters, rt.InputSchema) {
					t.Errorf("tool %d: %+v from %+v", i, ct, rt)
				}
			}
		})
	}
}

func TestToChatBillingHeader(t *testing.T) {
	body := readSample(t, "claude-code-turn1.json")
	keep, _ := toChat(t, string(body), Options{KeepBillingHeader: true})
	var m struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	json.Unmarshal([]byte(keep), &m)
	want := "x-anthropic-billing-header: cc_version=2.1.328.598; cc_entrypoint=sdk-cli;\nYou are a Claude agent"
	if !strings.HasPrefix(m.Messages[0].Content, want) {
		t.Errorf("kept system = %q", m.Messages[0].Content)
	}
	drop, _ := toChat(t, string(body), Options{})
	if strings.Contains(drop, "billing") {
		t.Errorf("billing block reached the chat body")
	}
	// A system that is only the billing block yields no system message.
	out, _ := toChat(t, `{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: a"}],"messages":[{"role":"user","content":"hi"}]}`, Options{})
	jsonEqual(t, out, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	// Only a first block is the billing block.
	out, _ = toChat(t, `{"system":[{"type":"text","text":"a"},{"type":"text","text":"x-anthropic-billing-header: b"}],"messages":[]}`, Options{})
	jsonEqual(t, out, `{"messages":[{"role":"system","content":"a\nx-anthropic-billing-header: b"}]}`)
}

func TestStripBillingBlock(t *testing.T) {
	body := readSample(t, "claude-code-turn1.json")
	got := StripBillingBlock(nil, body)
	block := `{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.598; cc_entrypoint=sdk-cli;"},`
	want := bytes.Replace(body, []byte(block), nil, 1)
	if bytes.Equal(want, body) {
		t.Fatal("sample lacks the block")
	}
	if !bytes.Equal(got, want) {
		t.Errorf("strip:\n got: %.300s\nwant: %.300s", got, want)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"system":[ {"type":"text","text":"x-anthropic-billing-header: x"} ],"messages":[]}`, `{"system":[  ],"messages":[]}`},
		{`{"system":[{"text":"x-anthropic-billing-header: x","type":"text"} , {"type":"text","text":"b"}]}`, `{"system":[{"type":"text","text":"b"}]}`},
		{`{"system":[{"type":"text","text":"\u0078-anthropic-billing-header: x"},{"type":"text","text":"b"}]}`, `{"system":[{"type":"text","text":"b"}]}`},
		{`{"system":"x-anthropic-billing-header: x"}`, `{"system":"x-anthropic-billing-header: x"}`},
		{`{"system":[{"type":"text","text":"a"},{"type":"text","text":"x-anthropic-billing-header: x"}]}`, `{"system":[{"type":"text","text":"a"},{"type":"text","text":"x-anthropic-billing-header: x"}]}`},
		{`{"messages":[{"role":"user","content":"x-anthropic-billing-header"}]}`, `{"messages":[{"role":"user","content":"x-anthropic-billing-header"}]}`},
	} {
		if got := StripBillingBlock(nil, []byte(tc.in)); string(got) != tc.want {
			t.Errorf("StripBillingBlock(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// Turn 1 asks, the chat upstream calls a tool, FromChat gives the client a
// tool_use, the client sends the result: turn 2's chat body carries the call
// and its result under the same id.
func TestToolRoundTrip(t *testing.T) {
	turn1 := `{"model":"m","max_tokens":100,"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],` +
		`"tool_choice":{"type":"auto"},"messages":[{"role":"user","content":"Weather in Paris?"}]}`
	chat1, info := toChat(t, turn1, Options{})
	jsonEqual(t, chat1, `{"model":"m","messages":[{"role":"user","content":"Weather in Paris?"}],"max_tokens":100,`+
		`"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":"auto"}`)

	resp := `{"id":"chatcmpl-1","object":"chat.completion","model":"m-up","choices":[{"index":0,"message":{"role":"assistant","content":"Let me check.",` +
		`"tool_calls":[{"id":"call_7","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},"finish_reason":"tool_calls"}],` +
		`"usage":{"prompt_tokens":50,"completion_tokens":12,"total_tokens":62}}`
	msg, err := FromChat(nil, []byte(resp), info)
	if err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, string(msg), `{"id":"msg_1","type":"message","role":"assistant","model":"m-up","content":[`+
		`{"type":"text","text":"Let me check."},{"type":"tool_use","id":"call_7","name":"get_weather","input":{"city":"Paris"}}],`+
		`"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":50,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":12}}`)

	var am struct {
		Content json.RawMessage `json:"content"`
	}
	json.Unmarshal(msg, &am)
	turn2 := `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":` + string(am.Content) + `},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_7","content":[{"type":"text","text":"18°C, sunny"}]},{"type":"text","text":"Thanks"}]}]}`
	chat2, _ := toChat(t, turn2, Options{})
	jsonEqual(t, rawMember(t, chat2, "messages"), `[{"role":"user","content":"Weather in Paris?"},`+
		`{"role":"assistant","content":"Let me check.","tool_calls":[{"id":"call_7","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},`+
		`{"role":"tool","tool_call_id":"call_7","content":"18°C, sunny"},{"role":"user","content":"Thanks"}]`)
}

func TestToChatMessages(t *testing.T) {
	for _, tc := range []struct {
		name     string
		messages string // Anthropic messages
		opt      Options
		want     string // chat messages
	}{
		{"thinking dropped without reasoning_field",
			`[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"text","text":"ok"}]}]`, Options{},
			`[{"role":"assistant","content":"ok"}]`},
		{"thinking into reasoning_field",
			`[{"role":"assistant","content":[{"type":"thinking","thinking":"a","signature":""},{"type":"redacted_thinking","data":"x"},{"type":"thinking","thinking":"b"},{"type":"text","text":"ok"}]}]`,
			Options{ReasoningField: "reasoning_content"},
			`[{"role":"assistant","content":"ok","reasoning_content":"a\nb"}]`},
		{"tool call without text",
			`[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}},{"type":"tool_use","id":"t2","name":"g","input":{"a":[1,2]}}]}]`, Options{},
			`[{"role":"assistant","content":null,"tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"t2","type":"function","function":{"name":"g","arguments":"{\"a\":[1,2]}"}}]}]`},
		{"tool results: string, blocks, error, empty; text after",
			`[{"role":"user","content":[{"type":"text","text":"before"},{"type":"tool_result","tool_use_id":"t1","content":"out"},{"type":"tool_result","tool_use_id":"t2","is_error":true,"content":[{"type":"text","text":"boom"},{"type":"text","text":"trace"}]},{"type":"tool_result","tool_use_id":"t3"}]}]`, Options{},
			`[{"role":"tool","tool_call_id":"t1","content":"out"},{"role":"tool","tool_call_id":"t2","content":"Error: boom\ntrace"},{"role":"tool","tool_call_id":"t3","content":""},{"role":"user","content":"before"}]`},
		{"images: base64 and url",
			`[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"image","source":{"type":"url","url":"https://example.com/a.jpg"}}]}]`, Options{},
			`[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},{"type":"image_url","image_url":{"url":"https://example.com/a.jpg"}}]}]`},
		{"image returned by a tool follows in the user message",
			`[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"screenshot"},{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"AAAA"}}]}]}]`, Options{},
			`[{"role":"tool","tool_call_id":"t1","content":"screenshot"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,AAAA"}}]}]`},
		{"system message in place, cache_control dropped",
			`[{"role":"user","content":"a"},{"role":"system","content":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":"b"}]`, Options{},
			`[{"role":"user","content":"a"},{"role":"system","content":"s"},{"role":"assistant","content":"b"}]`},
		{"escapes copied as they are",
			`[{"role":"user","content":[{"type":"text","text":"a\"b\u00e9\n"},{"type":"text","text":"\ud83d\ude00"}]}]`, Options{},
			`[{"role":"user","content":"a\"b\u00e9\n\n\ud83d\ude00"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := toChat(t, `{"model":"m","messages":`+tc.messages+`}`, tc.opt)
			if got := rawMember(t, out, "messages"); got != tc.want {
				t.Errorf("\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

func TestToChatParameters(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		opt         Options
		want        string // chat members after messages
	}{
		{"sampling, stop, user; top_k and unknown fields dropped",
			`"max_tokens":64,"temperature":0.2,"top_p":0.9,"top_k":40,"stop_sequences":["END","\n\n"],"metadata":{"user_id":"u1"},"service_tier":"auto","container":null`, Options{},
			`"max_tokens":64,"temperature":0.2,"top_p":0.9,"stop":["END","\n\n"],"user":"u1"`},
		{"empty stop_sequences dropped", `"stop_sequences":[]`, Options{}, ``},
		{"tool_choice any, no parallel",
			`"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true}`, Options{},
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required","parallel_tool_calls":false`},
		{"tool_choice tool",
			`"tools":[{"type":"custom","name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"f"}`, Options{},
			`"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":{"type":"function","function":{"name":"f"}}`},
		{"tool_choice none",
			`"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"none"}`, Options{},
			`"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":"none"`},
		{"server tools dropped, and with them tools and tool_choice",
			`"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}],"tool_choice":{"type":"auto"}`, Options{}, ``},
		{"thinking dropped by default",
			`"thinking":{"type":"enabled","budget_tokens":10000}`, Options{}, ``},
		{"thinking budget to effort", `"thinking":{"type":"enabled","budget_tokens":31999}`, Options{Effort: true}, `"reasoning_effort":"high"`},
		{"medium budget", `"thinking":{"type":"enabled","budget_tokens":2048}`, Options{Effort: true}, `"reasoning_effort":"medium"`},
		{"small budget", `"thinking":{"type":"enabled","budget_tokens":1024}`, Options{Effort: true}, `"reasoning_effort":"low"`},
		{"output_config effort wins", `"thinking":{"type":"adaptive"},"output_config":{"effort":"max"}`, Options{Effort: true}, `"reasoning_effort":"high"`},
		{"disabled thinking: no effort", `"thinking":{"type":"disabled"},"output_config":{"effort":"low"}`, Options{Effort: true}, ``},
		{"stream false", `"stream":false`, Options{}, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := toChat(t, `{"model":"m","messages":[],`+tc.extra+`}`, tc.opt)
			want := `{"model":"m","messages":[]`
			if tc.want != "" {
				want += "," + tc.want
			}
			want += "}"
			if out != want {
				t.Errorf("\n got: %s\nwant: %s", out, want)
			}
		})
	}
}

func TestToChatErrors(t *testing.T) {
	for _, tc := range []struct {
		body, code string
	}{
		{`{"model":"m"`, ""},
		{`[]`, ""},
		{`{"model":"m"}`, ""},
		{`{"messages":{}}`, ""},
		{`{"messages":[{"role":"tool","content":"x"}]}`, ""},
		{`{"messages":[{"role":"user","content":5}]}`, ""},
		{`{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"AA"}}]}]}`, "unsupported_parameter"},
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "unsupported_parameter"},
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AA"}}]}]}`, ""},
		{`{"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}`, ""},
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]}`, ""},
	} {
		out, info, err := ToChat([]byte("keep"), []byte(tc.body), Options{})
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || e.Code != tc.code || e.Message == "" {
			t.Errorf("ToChat(%s): err %v (%#v), want 400 %q", tc.body, err, e, tc.code)
		}
		if info != nil || string(out) != "keep" {
			t.Errorf("ToChat(%s) = %q, %v on error", tc.body, out, info)
		}
	}
}

func TestSessionBody(t *testing.T) {
	body := readSample(t, "claude-code-turn2.json")
	got, err := SessionBody(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	chat, _ := toChat(t, string(body), Options{KeepBillingHeader: true})
	// The translated messages minus the top-level system prompt.
	msgs := rawMember(t, chat, "messages")
	i := strings.Index(msgs, `{"role":"user"`)
	want := `{"messages":[` + msgs[i:] + `}`
	if string(got) != want {
		t.Errorf("\n got: %s\nwant: %s", got, want)
	}
	if bytes.Contains(got, []byte("billing")) {
		t.Error("billing block hashed")
	}
}
