package gemini

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// toChat runs ToChat and checks that its output is valid JSON.
func toChat(t *testing.T, body string, opt Options) (string, *Info) {
	t.Helper()
	out, info, err := ToChat(nil, []byte(body), opt)
	if err != nil {
		t.Fatalf("ToChat(%s): %v", body, err)
	}
	if !json.Valid(out) {
		t.Fatalf("ToChat(%s) = invalid JSON %s", body, out)
	}
	return string(out), info
}

const hi = `"contents":[{"role":"user","parts":[{"text":"hi"}]}]`

// Every row of the request table: the chat body ToChat writes, byte for byte.
func TestToChatTable(t *testing.T) {
	rf := Options{ReasoningField: "reasoning_content"}
	for _, tc := range []struct {
		name, body string
		opt        Options
		want       string
		dropped    []string // Info.DroppedFields
		tools      []string // Info.DroppedTools
	}{
		{name: "system instruction with role user, texts joined",
			body: `{"systemInstruction":{"role":"user","parts":[{"text":"be brief"},{"text":"be kind"}]},` + hi + `}`,
			want: `{"messages":[{"role":"system","content":"be brief\nbe kind"},{"role":"user","content":"hi"}]}`},
		{name: "system instruction as a bare string",
			body: `{"systemInstruction":"be brief",` + hi + `}`,
			want: `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`},
		{name: "system instruction non-text part dropped",
			body: `{"systemInstruction":{"parts":[{"inlineData":{"mimeType":"image/png","data":"AA=="}},{"text":"s"}]},` + hi + `}`,
			want: `{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`, dropped: []string{"systemInstruction.inlineData"}},
		{name: "empty system instruction: no message",
			body: `{"systemInstruction":{"parts":[]},` + hi + `}`,
			want: `{"messages":[{"role":"user","content":"hi"}]}`},
		{name: "user texts joined by newline",
			body: `{"contents":[{"role":"user","parts":[{"text":"a"},{"text":"b\"c"}]}]}`,
			want: `{"messages":[{"role":"user","content":"a\nb\"c"}]}`},
		{name: "roles function, tool and none are user",
			body: `{"contents":[{"parts":[{"text":"a"}]},{"role":"function","parts":[{"text":"b"}]},{"role":"tool","parts":[{"text":"c"}]}]}`,
			want: `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`},
		{name: "image inlineData and https fileData as content parts",
			body: `{"contents":[{"role":"user","parts":[{"text":"look"},{"inlineData":{"mimeType":"image/png","data":"iVBO"}},{"fileData":{"mimeType":"image/jpeg","fileUri":"https://x/y.jpg"}}]}]}`,
			want: `{"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBO"}},{"type":"image_url","image_url":{"url":"https://x/y.jpg"}}]}]}`},
		{name: "model texts concatenated, thoughts in the reasoning field, signature dropped",
			body: `{"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[{"text":"plan","thought":true},{"text":"Hel","thoughtSignature":"c2ln"},{"text":"lo"}]}]}`, opt: rf,
			want: `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"Hello","reasoning_content":"plan"}]}`},
		{name: "a part holding only a thought signature is dropped without a word",
			body: `{"contents":[{"role":"model","parts":[{"text":"a"},{"thoughtSignature":"c2ln"}]}]}`,
			want: `{"messages":[{"role":"assistant","content":"a"}]}`},
		{name: "thought parts dropped without a reasoning field",
			body: `{"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[{"text":"plan","thought":true},{"text":"A"}]}]}`,
			want: `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"A"}]}`},
		{name: "thought-only model turn sends nothing",
			body: `{"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[{"text":"plan","thought":true}]},{"role":"user","parts":[{"text":"r"}]}]}`, opt: rf,
			want: `{"messages":[{"role":"user","content":"q"},{"role":"user","content":"r"}]}`},
		{name: "function call with id, args as a JSON string; response output string",
			body: `{"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[{"functionCall":{"id":"write_file_1_0","name":"write_file","args":{"path":"a.txt"}},"thoughtSignature":"c2ln"}]},` +
				`{"role":"user","parts":[{"functionResponse":{"id":"write_file_1_0","name":"write_file","response":{"output":"done"}}}]}]}`,
			want: `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"write_file_1_0","type":"function","function":{"name":"write_file","arguments":"{\"path\":\"a.txt\"}"}}]},` +
				`{"role":"tool","tool_call_id":"write_file_1_0","content":"done"}]}`},
		{name: "calls without ids get call_<content>_<part>; responses take the earliest unanswered call of their name",
			body: `{"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[{"text":"two"},{"functionCall":{"name":"f"}},{"functionCall":{"name":"g","args":{}}},{"functionCall":{"name":"f","args":{"n":2}}}]},` +
				`{"role":"user","parts":[{"functionResponse":{"name":"f","response":{"error":"boom"}}},{"functionResponse":{"name":"g","response":{"a":1,"b":[2]}}},{"functionResponse":{"name":"f","response":{"output":"ok"}}},{"functionResponse":{"name":"h"}},{"text":"go on"}]}]}`,
			want: `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"two","tool_calls":[{"id":"call_1_1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"call_1_2","type":"function","function":{"name":"g","arguments":"{}"}},{"id":"call_1_3","type":"function","function":{"name":"f","arguments":"{\"n\":2}"}}]},` +
				`{"role":"tool","tool_call_id":"call_1_1","content":"Error: boom"},{"role":"tool","tool_call_id":"call_1_2","content":"{\"a\":1,\"b\":[2]}"},{"role":"tool","tool_call_id":"call_1_3","content":"ok"},{"role":"tool","tool_call_id":"call_2_3","content":""},{"role":"user","content":"go on"}]}`},
		{name: "function response images go into the user message after the tool messages",
			body: `{"contents":[{"role":"model","parts":[{"functionCall":{"id":"c1","name":"shot"}}]},{"role":"user","parts":[{"functionResponse":{"id":"c1","name":"shot","response":{"output":"see image"},"parts":[{"inlineData":{"mimeType":"image/png","data":"iVBO"}}]}}]}]}`,
			want: `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"shot","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"see image"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBO"}}]}]}`},
		{name: "code parts dropped and named",
			body:    `{"contents":[{"role":"model","parts":[{"executableCode":{"language":"PYTHON","code":"1"}},{"text":"x"}]},{"role":"user","parts":[{"codeExecutionResult":{"outcome":"OUTCOME_OK"}},{"text":"y"}]}]}`,
			want:    `{"messages":[{"role":"assistant","content":"x"},{"role":"user","content":"y"}]}`,
			dropped: []string{"executableCode", "codeExecutionResult"}},
		{name: "function declarations: parametersJsonSchema, Gemini parameters, none; other tools dropped",
			body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"a","description":"d","parametersJsonSchema":{"type":"object","properties":{"x":{"type":"string"}},"$schema":"http://json-schema.org/draft-07/schema#"},"response":{"type":"OBJECT"}},` +
				`{"name":"b","parameters":{"type":"OBJECT","properties":{"n":{"type":"INTEGER","nullable":true}},"propertyOrdering":["n"]}},{"name":"c","behavior":"BLOCKING"}]},{"googleSearch":{}},{"codeExecution":{}}]}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a","description":"d","parameters":{"type":"object","properties":{"x":{"type":"string"}},"$schema":"http://json-schema.org/draft-07/schema#"}}},` +
				`{"type":"function","function":{"name":"b","parameters":{"type":"object","properties":{"n":{"type":["integer","null"]}}}}},{"type":"function","function":{"name":"c","parameters":{"type":"object","properties":{}}}}]}`,
			tools: []string{"googleSearch", "codeExecution"}},
		{name: "only tools chat cannot carry: no tools, no tool_choice",
			body: `{` + hi + `,"tools":[{"googleSearch":{}}],"toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}]}`, tools: []string{"googleSearch"}},
		{name: "mode AUTO", body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"f"}]}],"toolConfig":{"functionCallingConfig":{"mode":"AUTO"}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":"auto"}`},
		{name: "mode VALIDATED", body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"f"}]}],"toolConfig":{"functionCallingConfig":{"mode":"VALIDATED"}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":"auto"}`},
		{name: "mode NONE", body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"f"}]}],"toolConfig":{"functionCallingConfig":{"mode":"NONE"}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":"none"}`},
		{name: "mode ANY", body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"f"}]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":"required"}`},
		{name: "mode ANY with one allowed name", body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"f"}]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY","allowedFunctionNames":["f"]}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`},
		{name: "mode ANY with two allowed names", body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"f"}]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY","allowedFunctionNames":["f","g"]}}}`,
			want:    `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":"required"}`,
			dropped: []string{"toolConfig.functionCallingConfig.allowedFunctionNames"}},
		{name: "mode unspecified", body: `{` + hi + `,"tools":[{"functionDeclarations":[{"name":"f"}]}],"toolConfig":{"functionCallingConfig":{"mode":"MODE_UNSPECIFIED"}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}`},
		{name: "generation config numbers; topK, safetySettings, labels dropped; candidateCount 1",
			body: `{` + hi + `,"generationConfig":{"temperature":0.2,"topP":0.9,"topK":40,"maxOutputTokens":100,"stopSequences":["END"],"presencePenalty":0.5,"frequencyPenalty":-0.5,"seed":7,"candidateCount":1,"responseLogprobs":true},"safetySettings":[{"category":"HARM_CATEGORY_HARASSMENT","threshold":"BLOCK_NONE"}],"labels":{"a":"b"}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"max_tokens":100,"temperature":0.2,"top_p":0.9,"presence_penalty":0.5,"frequency_penalty":-0.5,"seed":7,"stop":["END"]}`},
		{name: "empty stopSequences dropped", body: `{` + hi + `,"generationConfig":{"stopSequences":[]}}`,
			want: `{"messages":[{"role":"user","content":"hi"}]}`},
		{name: "JSON mode with responseJsonSchema (upper-case types)",
			body: `{` + hi + `,"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":{"type":"OBJECT","properties":{"s":{"type":"INTEGER"}},"required":["s"]}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"response","schema":{"type":"object","properties":{"s":{"type":"integer"}},"required":["s"]},"strict":false}}}`},
		{name: "JSON mode with responseSchema",
			body: `{` + hi + `,"generationConfig":{"responseMimeType":"application/json","responseSchema":{"type":"ARRAY","items":{"type":"STRING","nullable":true},"minItems":"1"}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"response","schema":{"type":"array","items":{"type":["string","null"]},"minItems":1},"strict":false}}}`},
		{name: "JSON mode without schema", body: `{` + hi + `,"generationConfig":{"responseMimeType":"application/json"}}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}}`},
		{name: "text/plain: nothing", body: `{` + hi + `,"generationConfig":{"responseMimeType":"text/plain"}}`,
			want: `{"messages":[{"role":"user","content":"hi"}]}`},
		{name: "text/x.enum dropped", body: `{` + hi + `,"generationConfig":{"responseMimeType":"text/x.enum","responseSchema":{"type":"STRING","enum":["a"]}}}`,
			want: `{"messages":[{"role":"user","content":"hi"}]}`, dropped: []string{"generationConfig.responseMimeType"}},
		{name: "stream from the URL",
			body: `{` + hi + `}`, opt: Options{Stream: true},
			want: `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, info := toChat(t, tc.body, tc.opt)
			if got != tc.want {
				t.Errorf("ToChat\n got: %s\nwant: %s", got, tc.want)
			}
			if !reflect.DeepEqual(info.DroppedFields, tc.dropped) {
				t.Errorf("DroppedFields = %q, want %q", info.DroppedFields, tc.dropped)
			}
			if !reflect.DeepEqual(info.DroppedTools, tc.tools) {
				t.Errorf("DroppedTools = %q, want %q", info.DroppedTools, tc.tools)
			}
		})
	}
}

func TestToChatEffort(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{`{"thinkingLevel":"MINIMAL"}`, "minimal"},
		{`{"thinkingLevel":"LOW"}`, "low"},
		{`{"thinkingLevel":"MEDIUM"}`, "medium"},
		{`{"thinkingLevel":"HIGH","includeThoughts":true}`, "high"},
		{`{"thinkingLevel":"XHIGH"}`, "high"},
		{`{"thinkingLevel":"high"}`, "high"},
		{`{"thinkingLevel":"THINKING_LEVEL_UNSPECIFIED"}`, ""},
		{`{"thinkingBudget":0}`, ""},
		{`{"thinkingBudget":-1}`, ""},
		{`{"thinkingBudget":1024}`, "low"},
		{`{"thinkingBudget":2048}`, "medium"},
		{`{"thinkingBudget":4095}`, "medium"},
		{`{"thinkingBudget":4096}`, "high"},
		{`{"thinkingBudget":24576}`, "high"},
		{`{"includeThoughts":true}`, ""},
	} {
		got, _ := toChat(t, `{`+hi+`,"generationConfig":{"thinkingConfig":`+tc.cfg+`}}`, Options{})
		want := `{"messages":[{"role":"user","content":"hi"}]}`
		if tc.want != "" {
			want = `{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"` + tc.want + `"}`
		}
		if got != want {
			t.Errorf("thinkingConfig %s:\n got %s\nwant %s", tc.cfg, got, want)
		}
	}
	_, info := toChat(t, `{`+hi+`,"generationConfig":{"thinkingConfig":{"includeThoughts":true}}}`, Options{Model: "m", Stream: true})
	if !info.IncludeThoughts || info.Model != "m" || !info.Stream {
		t.Errorf("info = %+v, want IncludeThoughts, model m, stream", info)
	}
	_, info = toChat(t, `{`+hi+`,"generationConfig":{"thinkingConfig":{"thinkingLevel":"HIGH"}}}`, Options{})
	if info.IncludeThoughts {
		t.Error("IncludeThoughts without includeThoughts")
	}
}

// Requests chat cannot carry are refused with a 400 in Google's terms.
func TestToChatRefused(t *testing.T) {
	for _, tc := range []struct{ name, body, code, msg string }{
		{"not JSON", `{"contents":`, "", "not valid JSON"},
		{"not an object", `[1]`, "", "JSON object"},
		{"no contents", `{"systemInstruction":"s"}`, "", "contents is not specified"},
		{"empty contents", `{"contents":[]}`, "", "contents is not specified"},
		{"bad role", `{"contents":[{"role":"system","parts":[{"text":"x"}]}]}`, "", "role must be user or model"},
		{"parts not an array", `{"contents":[{"role":"user","parts":{"text":"x"}}]}`, "", "parts must be an array"},
		{"cachedContent", `{` + hi + `,"cachedContent":"cachedContents/abc"}`, "unsupported_parameter", "cachedContent"},
		{"pdf inlineData", `{"contents":[{"role":"user","parts":[{"inlineData":{"mimeType":"application/pdf","data":"JVBE"}}]}]}`, "unsupported_parameter", "inlineData of type application/pdf"},
		{"audio in a function response", `{"contents":[{"role":"user","parts":[{"functionResponse":{"id":"c","name":"f","response":{},"parts":[{"inlineData":{"mimeType":"audio/wav","data":"UklG"}}]}}]}]}`, "unsupported_parameter", "audio/wav"},
		{"video fileData", `{"contents":[{"role":"user","parts":[{"fileData":{"mimeType":"video/mp4","fileUri":"https://x/v.mp4"}}]}]}`, "unsupported_parameter", "fileData of type video/mp4"},
		{"image fileData on gs://", `{"contents":[{"role":"user","parts":[{"fileData":{"mimeType":"image/png","fileUri":"gs://b/x.png"}}]}]}`, "unsupported_parameter", "http(s)"},
		{"candidateCount 2", `{` + hi + `,"generationConfig":{"candidateCount":2}}`, "unsupported_parameter", "candidateCount"},
		{"call without name", `{"contents":[{"role":"model","parts":[{"functionCall":{"args":{}}}]}]}`, "", "name is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, info, err := ToChat([]byte("keep"), []byte(tc.body), Options{})
			var e *Error
			if !errors.As(err, &e) || e.Status != 400 || e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("ToChat = %v (%#v), want a 400 %q error containing %q", err, e, tc.code, tc.msg)
			}
			if string(out) != "keep" || info != nil {
				t.Errorf("output with error: %q, %v", out, info)
			}
			if s := ErrorBody(e.Status, e.Code, e.Message, 0); !strings.Contains(string(s), `"status":"INVALID_ARGUMENT"`) {
				t.Errorf("ErrorBody = %s", s)
			}
		})
	}
}

// Schema normalization: Google's OpenAPI forms become JSON Schema, every
// other byte stays.
func TestAppendSchema(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"JSON Schema copied whole, white space included", `{"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}, "additionalProperties": false}`,
			`{"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}, "additionalProperties": false}`},
		{"only what changes is rewritten; a sibling needing nothing keeps its bytes",
			`{"type": "object", "properties": {"a": {"type": "STRING"}, "b": {"type": "string",  "enum": ["x"]}}, "required": [ "a" ]}`,
			`{"type":"object","properties":{"a":{"type":"string"},"b":{"type": "string",  "enum": ["x"]}},"required":[ "a" ]}`},
		{"upper-case types lower-cased", `{"type":"OBJECT","properties":{"a":{"type":"STRING"},"b":{"type":"NUMBER"},"c":{"type":"BOOLEAN"},"d":{"type":"ARRAY","items":{"type":"INTEGER"}},"e":{"type":"NULL"}}}`,
			`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"number"},"c":{"type":"boolean"},"d":{"type":"array","items":{"type":"integer"}},"e":{"type":"null"}}}`},
		{"TYPE_UNSPECIFIED dropped", `{"type":"TYPE_UNSPECIFIED","description":"x"}`, `{"description":"x"}`},
		{"nullable", `{"type":"STRING","nullable":true,"format":"date-time"}`, `{"type":["string","null"],"format":"date-time"}`},
		{"nullable false dropped", `{"nullable":false,"type":"string"}`, `{"type":"string"}`},
		{"propertyOrdering dropped", `{"type":"OBJECT","propertyOrdering":["b","a"],"properties":{"a":{"type":"STRING"}}}`, `{"type":"object","properties":{"a":{"type":"string"}}}`},
		{"int64 limits as strings", `{"type":"ARRAY","minItems":"1","maxItems":"10","items":{"type":"STRING","minLength":"2","maxLength":"5"}}`,
			`{"type":"array","minItems":1,"maxItems":10,"items":{"type":"string","minLength":2,"maxLength":5}}`},
		{"object limits as strings", `{"type":"OBJECT","minProperties":"1","maxProperties":"3"}`, `{"type":"object","minProperties":1,"maxProperties":3}`},
		{"properties named like keywords are names", `{"type":"OBJECT","properties":{"type":{"type":"STRING"},"nullable":{"type":"BOOLEAN"},"propertyOrdering":{"type":"STRING"}}}`,
			`{"type":"object","properties":{"type":{"type":"string"},"nullable":{"type":"boolean"},"propertyOrdering":{"type":"string"}}}`},
		{"anyOf, enum and $defs", `{"anyOf":[{"type":"STRING","enum":["OBJECT"]},{"$ref":"#/$defs/x"}],"$defs":{"x":{"type":"INTEGER"}}}`,
			`{"anyOf":[{"type":"string","enum":["OBJECT"]},{"$ref":"#/$defs/x"}],"$defs":{"x":{"type":"integer"}}}`},
		{"type array", `{"type":["STRING","NULL"]}`, `{"type":["string","null"]}`},
		{"lower-case types untouched", `{"type":"object","nullable":true}`, `{"type":["object","null"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(appendSchema(nil, []byte(tc.in)))
			if got != tc.want {
				t.Errorf("appendSchema(%s)\n got %s\nwant %s", tc.in, got, tc.want)
			}
			if !json.Valid([]byte(got)) {
				t.Errorf("invalid JSON %s", got)
			}
		})
	}
}

// SessionBody is the conversation without the system instruction and
// without reasoning: a native and a translated attempt hash the same bytes,
// whatever the upstream's reasoning field.
func TestSessionBody(t *testing.T) {
	body := `{"systemInstruction":{"parts":[{"text":"sys"}]},"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[{"text":"t","thought":true},{"text":"a"}]}]}`
	got, err := SessionBody(nil, []byte(body))
	want := `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`
	if err != nil || string(got) != want {
		t.Fatalf("SessionBody = %s, %v; want %s", got, err, want)
	}
	if _, err := SessionBody(nil, []byte(`{"contents":[]}`)); err == nil {
		t.Error("SessionBody of an empty conversation: no error")
	}
}

// The same body gives the same bytes every time (made-up ids included), so
// upstream prefix caches stay warm.
func TestToChatDeterministic(t *testing.T) {
	body := `{"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[{"functionCall":{"name":"f"}}]},{"role":"user","parts":[{"functionResponse":{"name":"f","response":{"output":"x"}}}]}]}`
	a, _ := toChat(t, body, Options{})
	b, _ := toChat(t, body, Options{})
	if a != b || !strings.Contains(a, `"tool_call_id":"call_1_0"`) {
		t.Errorf("two translations differ or lack the made-up id:\n%s\n%s", a, b)
	}
}
