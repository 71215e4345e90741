// Package anthropic translates between the Anthropic Messages API (the front
// Claude Code and the Anthropic SDKs speak) and OpenAI chat completions (the
// back most upstreams serve). It is pure bytes → bytes: no Caddy,
// no llmroute, no reflection-based encoding/json (bodies are walked with the raw
// scanner in llmroute/internal/jsonscan, shared with llmroute/transform and
// wire/responses). Tests use transform to run the think splitter in front of Stream.
//
// # How the core uses it
//
// For a Messages request (POST …/messages, …?beta=true) whose chosen
// upstream serves "messages" natively:
//
//	body = StripBillingBlock(buf, body)      // unless keep_billing_header
//	// then model swap + patches as for chat; the answer streams back as is
//
// For an upstream that serves only chat:
//
//	chat, info, err := ToChat(buf, body, Options{
//		KeepBillingHeader: p.KeepBillingHeader,
//		ReasoningField:    p.ReasoningField,
//	})
//	// err is an *Error: answer ErrorBody(e.Status, e.Code, e.Message)
//	// chat then goes through transform.RewriteRequest (model swap, patches,
//	// reasoning backfill) exactly like a chat client's body.
//
//	// 2xx, not streamed (after transform.RewriteCompletion for think_tags):
//	msg, err := FromChat(out, upstreamBody, info)
//
//	// 2xx, streamed: upstream bytes → transform.StreamRewriter (think_tags)
//	// → Stream → client. Close at clean EOF; Fail after a cut or stall.
//	st := NewStream(info, writeToClient)
//	rw := transform.NewStreamRewriter(mode, func(b []byte) error { _, err := st.Write(b); return err })
//
//	// 4xx/5xx from the chat upstream the client is to see:
//	TranslateError(status, upstreamBody)
//
// Proxy-made errors on this front use ErrorBody (type per status:
// ErrorType). count_tokens without a native upstream answers
// CountTokensBody(CountTokensEstimate(body)) with X-LLM-Route-Estimate:
// true. GET …/models with anthropic-version answers ModelsBody.
//
// Sessions: hash SessionBody(body) with transform.Sessions.ID. It is
// the chat messages ToChat sends, minus the top-level system prompt, so the
// billing block is never hashed and a conversation keeps its id when failover
// moves it between a native and a translated upstream (the hash ignores
// reasoning fields, so reasoning_field does not matter). Hashing ToChat's own
// output gives the same id, but native attempts have no ToChat output;
// SessionBody is the one call that serves both.
//
// # Request: Messages → chat
//
//	model                         copied (the core swaps it afterwards)
//	system string | text blocks   first chat message, role system, texts joined by "\n";
//	                              a first block starting "x-anthropic-billing-header:" dropped
//	messages[] role user          string → content string; text blocks → one string joined by
//	                              "\n"; with images → content parts (text, image_url)
//	  image base64 / url          image_url {url: "data:<media_type>;base64,<data>" | url}
//	  tool_result                 a tool message {tool_call_id, content} per block, before the
//	                              user message of the same turn; content string or text blocks
//	                              joined by "\n"; is_error → "Error: " prefix; images a tool
//	                              returned go into the user message that follows
//	messages[] role assistant     text blocks → content (joined "\n"; null when only tool calls);
//	                              tool_use → tool_calls {id, function{name, arguments: input
//	                              bytes as a JSON string}}; thinking → opt.ReasoningField
//	                              (joined "\n"), dropped when it is empty; redacted_thinking dropped
//	messages[] role system        a system message in place (Claude Code sends one after the
//	                              first user message)
//	max_tokens                    max_tokens (not max_completion_tokens: llama.cpp, vLLM,
//	                              Ollama, DeepSeek and MiniMax take max_tokens)
//	temperature, top_p            copied
//	stop_sequences                stop (an empty list is dropped)
//	metadata.user_id              user
//	tools[] (custom / no type)    {type: function, function{name, description, parameters:
//	                              input_schema bytes as sent}}
//	tool_choice                   auto → "auto", any → "required", none → "none",
//	                              tool → {type: function, function{name}};
//	                              disable_parallel_tool_use → parallel_tool_calls: false
//	thinking, output_config       reasoning_effort only with opt.Effort (see below)
//	stream: true                  stream: true, stream_options: {include_usage: true}
//
// # Fields not translated
//
// On a translated upstream (a native one gets the body as sent), checked
// against request.go. Nothing below is logged: ToChat reads only the fields
// in the table above, so every other field is left out by construction.
//
//	top_k                          dropped (OpenAI rejects it; a patch can add it for
//	                               vLLM / llama.cpp)
//	thinking, output_config        dropped: the core never sets Options.Effort (chat
//	                               upstreams that do not reason reject reasoning_effort;
//	                               a patch can set it)
//	context_management, container, dropped
//	mcp_servers, service_tier,
//	any other top-level field
//	metadata (but user_id)         dropped
//	tools[] of a type other than   dropped (server tools: web_search, web_fetch,
//	"custom" or none               code_execution, bash, text_editor, computer, memory …);
//	                               a list of only those sends no tools and no tool_choice
//	tools[].cache_control, strict, dropped (only name, description, input_schema are read)
//	defer_loading, input_examples
//	cache_control, citations       dropped everywhere (blocks, system, tools)
//	thinking blocks in history     → Options.ReasoningField; without one dropped; their
//	                               signature always dropped
//	redacted_thinking              dropped
//	document blocks (user)         400 unsupported_parameter (a silently lost PDF would
//	                               give a wrong answer)
//	image source "file" (or any    400 unsupported_parameter
//	but base64 / url)
//	search_result, server_tool_use, dropped (unknown block types in history are dropped;
//	*_tool_result, container_upload blocks  in a user message only document is refused)
//	tool_result images             not dropped: moved into the user message after it
//	anthropic-beta features        not translated (the header itself is forwarded, like
//	                               anthropic-version, to every upstream: the core's
//	                               allow-list; chat servers ignore it)
//
// In the answer, fields chat cannot give: stop_sequence is always null,
// cache_creation_input_tokens 0, no server_tool_use usage, no citations.

// thinking → reasoning_effort: off by default because chat upstreams that do
// not reason (gpt-4o, most local instruct models behind strict servers)
// reject reasoning_effort with a 400, and reasoning models reason anyway.
// With Options.Effort, enabled/adaptive thinking maps output_config.effort
// (low, medium; high, xhigh, max → high) or else thinking.budget_tokens
// (< 2048 low, < 4096 medium, else high: the inverse of the budgets LiteLLM
// and agentgateway give low/medium/high, 1024/2048/4096) or else medium;
// disabled thinking sends nothing. Operators can always set
// reasoning_effort with a patch instead.
//
// # Response: chat → Messages
//
//	id                       "msg_" + the chat id without "chatcmpl-" (random when absent)
//	model                    the upstream's model, else the requested one
//	reasoning_content | reasoning   a thinking block first, signature ""
//	content (string or parts) a text block; refusal a text block too
//	tool_calls               tool_use blocks, input = the parsed arguments object
//	                         ({} when they are not a JSON object, e.g. cut by max_tokens)
//	finish_reason            stop → end_turn, length → max_tokens, tool_calls and
//	                         function_call → tool_use, content_filter → refusal; a turn
//	                         with tool calls is tool_use unless it was cut (length)
//	stop_sequence            always null (chat does not say which stop matched)
//	usage                    input_tokens = prompt_tokens − cached, output_tokens =
//	                         completion_tokens, cache_read_input_tokens = cached
//	                         (prompt_tokens_details.cached_tokens or DeepSeek's
//	                         prompt_cache_hit_tokens), cache_creation_input_tokens 0
//
// Anthropic counts cache reads apart from input_tokens (Claude Code adds them
// up for its context meter), chat includes them in prompt_tokens: hence the
// subtraction.
//
// # Stream
//
// See Stream. Usage in message_start is zero (a chat upstream reports it at
// the end); message_delta carries input_tokens, cache_read_input_tokens and
// output_tokens when the upstream sent usage, output_tokens 0 otherwise.
// Thinking blocks are produced whenever the upstream reasons, whether or not
// the client enabled thinking (dropping them would hide what the model did;
// the SDKs accept them).
//
// # What was taken from others, and where this differs
//
// Envoy AI Gateway (internal/translator/anthropic_openai.go,
// anthropic_helper.go): the finish_reason table including content_filter →
// refusal, tool_choice any → required, stream_options.include_usage, the
// usage chunk consumed, closing events at [DONE] or end of stream, a
// tool_use block per tool call index. Different here: Envoy flattens every
// message to text (no images, no tool_result/tool_use history, no
// thinking), ends a turn whose tool calls came with finish_reason "stop"
// as end_turn (so the client never runs them), sends
// max_completion_tokens, and marshals typed structs; this package carries
// the whole history, keeps input_schema and tool input bytes as sent (so a
// prefix cache upstream sees identical bytes turn after turn), and scans and
// appends raw bytes (0 allocs per stream chunk).
//
// LiteLLM (AnthropicAdapter → translate_anthropic_to_openai) and its
// stream wrapper: message_start on the first chunk, a content block started
// and stopped around each run of deltas, the finish_reason mapped exactly
// (clients cannot parse anything else); its effort budgets. Different here:
// effort mapping is opt-in, not default.
//
// agentgateway (crates/agentgateway/src/llm/conversion/messages.rs, the
// chat → Messages direction of the same pair): refusal ⇄ content_filter,
// the effort budgets above, top_k left out because chat has none. Different
// here: agentgateway keys error types on Google-style statuses; this package
// keys them on the HTTP status (ErrorType).
//
// # Decisions where the spec is silent
//
//   - Text joins use "\n" everywhere (system blocks, user text blocks, tool
//     result blocks, assistant text blocks, thinking blocks).
//   - Unknown content block types in history are dropped, except document
//     (400, above).
//   - A tool_use without id or name, a tool_result without tool_use_id, an
//     image without a usable source, a role other than user, assistant or
//     system, and content that is neither a string nor an array are 400
//     invalid_request_error.
//   - Stream: deltas for a tool call whose block was already closed
//     (interleaved parallel calls, which OpenAI does not send) are emitted at
//     that call's block index after its content_block_stop. Chat chunks with
//     several choices: only choice 0 is translated.
//   - Stream payloads that are not valid JSON (comments, junk, a chunk that
//     does not parse as it stands) are ignored, as transform's think splitter
//     passes them through unsplit.
//   - Errors inside a stream ({"error":…}) and Fail use type api_error; the
//     upstream's or the core's code (e.g. stream_stalled) is error.code.
//   - A stream that ends before any chunk still yields a complete empty
//     message (message_start … message_stop), so SDKs see a normal end;
//     Claude Code retries an empty stream without streaming.
package anthropic
