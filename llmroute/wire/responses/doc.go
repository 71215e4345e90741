// Package responses translates between the OpenAI Responses API (the wire
// format of Codex CLI) and chat completions, for upstreams that serve only
// chat. It is pure bytes → bytes: no Caddy, no llmroute import.
//
// # Use from the routing core
//
//	chat, info, err := responses.ToChat(buf[:0], body, responses.Options{ReasoningField: p.ReasoningField})
//	// err is a *responses.Error: write err.(*Error).Body() with err.Status.
//	// info.DroppedTools / DroppedItems: log a warning; info.PromptCacheKey: session.
//	// Swap model and merge patches on chat as for a chat request; send it.
//	// Non-stream 2xx:  out, err := responses.FromChat(nil, upstreamBody, info)
//	// Stream 2xx:      s := responses.NewStream(info, writeToClient)
//	//                  io.Copy(s, upstream) (or Write per read) → s.Close() on a clean end,
//	//                  s.Fail(code, msg) on a break after the first byte, then abort.
//	// Upstream 4xx/5xx: responses.TranslateError(status, upstreamBody).
//	// Proxy errors:     responses.ErrorBody(status, code, message).
//
// The think-tag rewriter (transform.StreamRewriter) may sit between the
// upstream and Stream: its reasoning_content deltas become reasoning items.
// Stream emits one whole SSE event per emit call, already named
// (`event: <type>`), and never a [DONE].
//
// # What happens to each request field (translated upstreams)
//
//	instructions (string)        leading system message
//	input (string)               one user message
//	input message items          developer/system → system (consecutive ones joined
//	                             with a blank line: many local chat templates take one
//	                             system message); user, assistant kept; content parts:
//	                             input_text/output_text/refusal → text (joined with
//	                             blank lines), input_image → image_url part (user only),
//	                             input_file → dropped (DroppedItems)
//	function_call                assistant tool_calls; consecutive calls, and an
//	                             assistant text before them, form one assistant message
//	function_call_output         tool message (content parts → their text)
//	custom_tool_call(_output)    tool_calls of the function standing for the custom
//	                             tool, arguments {"input": <text>} / tool message
//	reasoning                    content text, else summary text → Options.ReasoningField
//	                             of the next assistant message; without a field dropped;
//	                             encrypted_content always dropped
//	additional_tools,            their tools join tools (below); the item itself
//	tool_search_output           produces no message
//	item_reference               400 unsupported_parameter (the proxy stores no items)
//	other items (web_search_call, compaction, …)  dropped (DroppedItems)
//	tools: function              chat function (parameters, strict kept)
//	tools: custom                chat function with one required string parameter
//	                             `input`; a grammar/regex format is appended to the
//	                             description; calls come back as custom_tool_call
//	tools: namespace             members flattened: name "<ns>__<name>" ("<ns><name>"
//	                             when ns ends in "_", as Codex's mcp__server__ does);
//	                             calls come back with name and namespace as declared
//	tools: anything else         dropped (DroppedTools): web_search, file_search, mcp,
//	                             code_interpreter, image_generation, tool_search, shell …
//	tool_choice                  auto/none/required kept; {type:function|custom,name}
//	                             → that chat function; allowed_tools → its mode; a
//	                             hosted tool → auto; left out when no tools remain
//	parallel_tool_calls          kept (only with tools)
//	reasoning.effort             reasoning_effort (summary ignored)
//	max_output_tokens            max_tokens
//	text.format                  json_schema → response_format json_schema;
//	                             json_object → json_object; text → nothing
//	temperature, top_p           kept
//	user, safety_identifier      user (user wins when both are set)
//	prompt_cache_key             Info.PromptCacheKey (not sent)
//	stream                       stream + stream_options.include_usage
//	previous_response_id,        400 unsupported_parameter
//	conversation, prompt,
//	background:true
//	store, include, metadata, text.verbosity, truncation, top_logprobs,
//	service_tier, client_metadata, stream_options …  ignored
//
// # Fields not translated
//
// The same table, only what does not reach a chat upstream, and how
// (checked against request.go). "Logged" means listed in DroppedTools or
// DroppedItems, which the core logs as one warning per request
// ("responses request: left out what a chat upstream cannot take").
//
//	previous_response_id, conversation,   400 unsupported_parameter, nothing sent
//	prompt, background:true, item_reference
//	a message item with a role other than  400 invalid_value
//	user/assistant/system/developer
//	hosted tools (web_search, file_search,  dropped, logged (DroppedTools);
//	mcp, code_interpreter, image_generation, a tool_choice naming one → auto
//	tool_search, local_shell, shell, …),
//	a namespace inside a namespace
//	a function/custom tool without a name  dropped, not logged
//	hosted-tool calls and outputs in input  dropped, logged (DroppedItems)
//	(web_search_call, file_search_call,
//	mcp_call, …), compaction, unknown items
//	input_file parts, input_image outside   dropped, logged (DroppedItems)
//	a user message (assistant, system,
//	tool output), an image with only file_id
//	reasoning items                        text → Options.ReasoningField; without one
//	                                       dropped, not logged; encrypted_content always
//	                                       dropped, not logged (opaque to another model)
//	custom tool format (grammar, regex)    not enforced: appended to the description
//	tool_choice allowed_tools list          only its mode (auto / required) is kept
//	reasoning.summary, text.verbosity,     ignored, not logged
//	store, include, metadata, truncation,
//	top_logprobs, max_tool_calls,
//	service_tier, client_metadata,
//	stream_options, prompt_cache_retention,
//	item ids and statuses, any other field
//	prompt_cache_key                       not sent: the session id (Info.PromptCacheKey)
//
// In the answer, what chat cannot give: no annotations or logprobs,
// reasoning has no summary and no encrypted_content (include is ignored),
// tools are echoed as [], store false.

// # The answer
//
// A Response object (id resp_…, object "response", created_at, status
// completed, or incomplete with incomplete_details.reason max_output_tokens
// / content_filter, model as the upstream named it, output, usage) whose
// output holds, in order: a reasoning item (from reasoning_content or
// reasoning) with the text as reasoning_text content and an empty summary;
// a message with one output_text part (annotations and logprobs empty);
// then each tool call as a function_call (call_id from the chat tool call
// id, a generated call_… when the upstream sent none, id fc_…) or a
// custom_tool_call (input unwrapped from {"input": …}; arguments that are
// not that shape become the input as they are, id ctc_…). Usage maps
// prompt/completion/total tokens and cached/reasoning token details; usage
// the upstream did not report is null. Ids share one random base per
// response: stable within it, unique across responses. The request's
// instructions, max_output_tokens, metadata, parallel_tool_calls,
// prompt_cache_key, reasoning, safety_identifier, temperature, text,
// tool_choice, top_p and user are echoed; tools are echoed as [] (they can
// be tens of kilobytes and no client reads them back).
//
// # Decisions where the spec is silent
//
//   - Only the first choice of a chat answer is translated (Responses has
//     one output).
//   - A reasoning item is emitted with reasoning_text events, not summary
//     events: the text is the model's raw reasoning, not a summary. Codex
//     shows it when show_raw_agent_reasoning is on.
//   - A tool call's deltas that arrive after another output began (an
//     upstream interleaving calls) are dropped; chat servers stream calls one
//     after another.
//   - An error object inside an upstream stream ends it as response.failed
//     with the upstream's message and code (upstream_error when it has none).
//   - Request fields are read with encoding/json (once per request); the
//     stream path walks chunks with llmroute/internal/jsonscan (the raw
//     scanner shared with transform) and allocates only when buffers grow.
package responses
