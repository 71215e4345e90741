// Package gemini translates between the Google Gemini API (generateContent
// and streamGenerateContent, the front Gemini CLI and the genai SDKs speak)
// and OpenAI chat completions (the back most upstreams serve). It is pure
// bytes → bytes: no Caddy, no llmroute, no reflection-based encoding/json
// (bodies are walked with the raw scanner in llmroute/internal/jsonscan,
// shared with llmroute/transform and the other wire packages).
//
// # How the core uses it
//
// The model and the method are in the URL (POST
// …/v1beta/models/{model}:generateContent, …:streamGenerateContent?alt=sse);
// the body has neither. For an upstream whose apis include "gemini" the body
// goes up as sent (the upstream's model goes into its URL). For an upstream
// that serves only chat:
//
//	chat, info, err := ToChat(buf, body, Options{
//		ReasoningField: p.ReasoningField,
//		Model:          modelFromPath,
//		Stream:         verb == "streamGenerateContent",
//	})
//	// err is an *Error: answer ErrorBody(e.Status, e.Code, e.Message, 0).
//	// chat has no "model": transform.RewriteRequest adds the upstream's,
//	// then patches and reasoning backfill apply as for a chat client.
//	// info.DroppedTools / DroppedFields: log them once as a warning.
//
//	// 2xx, not streamed:
//	out, err := FromChat(out, upstreamBody, info)
//
//	// 2xx, streamed: upstream bytes → (think splitter) → Stream → client.
//	// Close at clean EOF (ErrUnfinished: continue or Fail); Fail after a
//	// cut or stall. No heartbeat comments on this front: the SDKs reject
//	// any line that is not "data:".
//	st := NewStream(info, writeToClient)
//
//	// 4xx/5xx from the chat upstream the client is to see:
//	TranslateError(status, upstreamBody)
//
// Proxy-made errors on this front use ErrorBody (status names: StatusName);
// a native stream that breaks after its first byte ends with
// AppendErrorEvent. countTokens without a native upstream answers
// CountTokensBody(CountTokensEstimate(body)); GET …/v1beta/models answers
// ModelsBody, GET …/v1beta/models/{m} ModelBody.
//
// Sessions: hash SessionBody(body) with transform.Sessions.ID. It is the
// chat messages ToChat sends minus the system instruction (and without
// reasoning), so a conversation keeps its id when failover moves it between
// a native and a translated upstream.
//
// # Request: Gemini → chat
//
//	systemInstruction             first message, role system: its text parts joined by "\n"
//	                              (any role; Gemini CLI sends "user"; a bare string too)
//	contents[] role user (also    tool messages first (one per functionResponse part), then
//	function, tool, none)         one user message: text parts joined by "\n"; with images,
//	                              content parts (text, image_url) in part order
//	  inlineData image/*          image_url {url: "data:<mimeType>;base64,<data>"}
//	  fileData image/* http(s)    image_url {url: fileUri}
//	  functionResponse            {role: tool, tool_call_id: id, content}: the string of a
//	                              response {"output": s}; "Error: " + s for {"error": s};
//	                              else the response object's JSON; its image parts go into
//	                              the user message that follows
//	contents[] role model         one assistant message: text parts concatenated (no
//	                              separator) as content, null when there are only calls;
//	                              functionCall → tool_calls {id, function{name, arguments:
//	                              args bytes as a JSON string, "{}" when absent}};
//	                              thought parts → opt.ReasoningField (concatenated)
//	call ids                      functionCall.id / functionResponse.id copied; a call
//	                              without id gets call_<content index>_<part index>; a
//	                              response without id takes the id of the earliest
//	                              unanswered call of its name in the latest model turn,
//	                              else call_<content index>_<part index>
//	tools[].functionDeclarations  {type: function, function{name, description, parameters}}:
//	                              parametersJsonSchema, else parameters, normalized to JSON
//	                              Schema; else {"type":"object","properties":{}}
//	toolConfig.functionCalling-   AUTO, VALIDATED → "auto"; ANY → "required" (one
//	Config.mode                   allowedFunctionNames → {type: function, function{name}});
//	                              NONE → "none"
//	generationConfig:
//	  maxOutputTokens             max_tokens
//	  temperature, topP           temperature, top_p
//	  presencePenalty,            presence_penalty, frequency_penalty, seed
//	  frequencyPenalty, seed
//	  stopSequences               stop (an empty list is dropped)
//	  responseMimeType            application/json → response_format: json_schema {name:
//	                              "response", schema, strict: false} with
//	                              responseJsonSchema or responseSchema (normalized), else
//	                              json_object
//	  thinkingConfig              reasoning_effort: thinkingLevel MINIMAL, LOW, MEDIUM →
//	                              minimal, low, medium; HIGH, XHIGH → high; else
//	                              thinkingBudget < 2048 low, < 4096 medium, higher high
//	                              (0 and -1: none); includeThoughts → Info.IncludeThoughts
//	URL method                    streamGenerateContent → stream: true, stream_options:
//	                              {include_usage: true}
//
// Schemas (parameters, parametersJsonSchema, responseSchema,
// responseJsonSchema) become JSON Schema: upper-case type names (Google's
// OpenAPI enum: STRING, OBJECT …; Gemini CLI sends them inside
// responseJsonSchema) are lower-cased and TYPE_UNSPECIFIED dropped,
// "nullable": true turns "type": "t" into ["t", "null"], propertyOrdering is
// dropped, and int64 limits sent as strings (minItems "3") become numbers.
// Every other byte ($schema, additionalProperties, enum, format …) is
// copied as sent; a schema with none of these is copied whole.
//
// reasoning_effort is sent by default (thinkingConfig means the client asked
// for reasoning; Gemini CLI always sends thinkingLevel HIGH). A chat
// upstream that rejects the field needs a patch {"reasoning_effort": null}.
//
// # Fields not translated
//
// On a translated upstream (a native one gets the body as sent), checked
// against request.go. Info.DroppedTools and Info.DroppedFields name the
// drops that change what the model sees or may do, for the core's warning
// log; the sampling knobs chat lacks are dropped without a word.
//
//	cachedContent                  400 INVALID_ARGUMENT unsupported_parameter (the cached
//	                               prompt lives at Google: dropping it would lose it)
//	inlineData / fileData not      400 INVALID_ARGUMENT unsupported_parameter (a silently
//	image/* (PDF, audio, video,    lost file gives a wrong answer); also inside
//	text); fileData not http(s)    functionResponse.parts
//	generationConfig.candidate-    400 INVALID_ARGUMENT unsupported_parameter above 1 (the
//	Count                          translator and the stream follower carry one choice)
//	thoughtSignature               dropped always (chat has no place for it)
//	thought parts (model turns)    → Options.ReasoningField; without one dropped
//	executableCode, codeExecution- dropped; named in DroppedFields (a model turn left
//	Result, videoMetadata, tool-   with no text and no call sends no message)
//	Call, toolResponse, other part
//	kinds
//	systemInstruction non-text     dropped; DroppedFields "systemInstruction.<kind>"
//	parts
//	tools[] other than function-   dropped, named in DroppedTools (googleSearch,
//	Declarations                   googleSearchRetrieval, codeExecution, urlContext,
//	                               computerUse, fileSearch, retrieval, mcpServers,
//	                               googleMaps, enterpriseWebSearch …); only those: no tools
//	                               and no tool_choice
//	functionDeclarations[].        dropped (only name, description and the schema are read)
//	response, responseJsonSchema,
//	behavior
//	allowedFunctionNames (2 or     dropped (chat cannot restrict to a subset); DroppedFields
//	more names)
//	functionCallingConfig.         dropped
//	streamFunctionCallArguments,
//	toolConfig.retrievalConfig
//	responseMimeType text/x.enum   dropped; DroppedFields
//	topK                           dropped (OpenAI rejects it; a patch can add top_k for
//	                               vLLM / llama.cpp)
//	responseLogprobs, logprobs,    dropped
//	responseModalities,
//	speechConfig, mediaResolution,
//	audioTimestamp, enableAffec-
//	tiveDialog, routingConfig,
//	modelSelectionConfig,
//	imageConfig, other generation-
//	Config members
//	safetySettings, labels,        dropped
//	serviceTier, any other
//	top-level member
//
// In the answer, what chat cannot give: no thoughtSignature, no
// safetyRatings, citationMetadata, groundingMetadata, avgLogprobs or
// promptFeedback; function calls come whole in the last stream event.
//
// # Response: chat → Gemini
//
//	{"candidates":[{"content":{"role":"model","parts":[…]},"finishReason":…,"index":0}],
//	 "usageMetadata":{…},"modelVersion":…,"responseId":…}
//
//	reasoning_content | reasoning  a part {"text":…,"thought":true} first, only when
//	                               Info.IncludeThoughts (as Google does)
//	content (string or parts)      a text part; refusal a text part too
//	tool_calls                     functionCall parts {id, name, args}: id = the chat id (a
//	                               random call_ + 24 [a-z0-9] when absent), args = the
//	                               parsed arguments object; arguments that are not an
//	                               object leave the call out and make the finishReason
//	                               MALFORMED_FUNCTION_CALL (Gemini's own signal), except
//	                               when the answer was cut (length: args {})
//	nothing at all                 parts [{"text":""}] (code reading parts[0] keeps working)
//	finish_reason                  stop, tool_calls, function_call, none → STOP; length →
//	                               MAX_TOKENS; content_filter → SAFETY; else OTHER
//	usage                          promptTokenCount = prompt_tokens (cached included, as
//	                               Google counts); cachedContentTokenCount = cached
//	                               (prompt_tokens_details.cached_tokens or DeepSeek's
//	                               prompt_cache_hit_tokens; left out when 0);
//	                               thoughtsTokenCount = completion_tokens_details.
//	                               reasoning_tokens (left out when 0);
//	                               candidatesTokenCount = completion_tokens − thoughts;
//	                               totalTokenCount = total_tokens, else prompt + completion;
//	                               no usage, no usageMetadata
//	model, id                      modelVersion (else Options.Model), responseId (else 16
//	                               random hex digits)
//
// Every string written towards the client has U+2028 and U+2029 escaped
// (the Node SDK's event regular expression stops at them).
//
// # Stream
//
// See Stream. Events are "data: <one-line JSON>\r\n\r\n", Google's framing;
// the final event carries the function calls, finishReason and
// usageMetadata together.
//
// # Errors
//
// {"error":{"code":<HTTP status>,"message":…,"status":<StatusName>,"details":[…]}}
// with a google.rpc.ErrorInfo (reason = the proxy's or the upstream's code,
// domain "llm_route") and, with a Retry-After, a google.rpc.RetryInfo
// (Gemini CLI times its retry of a 429 by retryDelay). Inside a stream the
// same object is one data event; an upstream {"error":…} chunk keeps its
// numeric code as status when it is one (else 500), Fail uses 503
// UNAVAILABLE (504 DEADLINE_EXCEEDED for request_timeout).
//
// # Decisions where the spec is silent
//
//   - User text parts are joined by "\n" (as the other fronts); model text
//     parts are concatenated without one, since a streamed answer stored as
//     many parts must read back as it was written.
//   - A content with a role other than user, model, function or tool, parts
//     that are not an array, a functionCall without name, and a request
//     without contents are 400 INVALID_ARGUMENT.
//   - Stream payloads that are not valid JSON are ignored; chat chunks with
//     several choices: only choice 0 is translated.
//   - A stream that ends with [DONE] before any chunk still yields one final
//     event ({"text":""}, STOP), so SDKs see a normal end.
package gemini
