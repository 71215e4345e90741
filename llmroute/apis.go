package llmroute

import (
	"fmt"
	"net/http"
)

// api is a wire API an upstream may serve natively.
type api uint8

const (
	apiChat api = iota
	apiMessages
	apiResponses
	apiEmbeddings
	apiCompletions
	apiGemini
	numAPIs
)

// apiNames are the config words (and the `api` log field) of each api.
var apiNames = [numAPIs]string{"chat", "messages", "responses", "embeddings", "completions", "gemini"}

func (a api) String() string { return apiNames[a] }

// apiSet is a set of apis, one bit each.
type apiSet uint8

func (s apiSet) has(a api) bool { return s&(1<<a) != 0 }

// parseAPIs reads an apis list; empty is the default ["chat"].
func parseAPIs(list []string) (apiSet, error) {
	if len(list) == 0 {
		return 1 << apiChat, nil
	}
	var s apiSet
	for _, w := range list {
		found := false
		for a, name := range apiNames {
			if w == name {
				s |= 1 << api(a)
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("%q is not one of chat, messages, responses, embeddings, completions, gemini", w)
		}
	}
	return s, nil
}

// upstream endpoints, one URL per path, precomputed at provision.
type endpoint uint8

const (
	epChat endpoint = iota
	epMessages
	epCountTokens
	epResponses
	epEmbeddings
	epCompletions
	// Gemini's paths name the model (`/models/{model}:generateContent`):
	// each upstream's are made from its own model (geminiURLs).
	epGeminiGenerate
	epGeminiStream
	epGeminiCount
	numEndpoints
)

// endpointPaths are appended to the provider URL (the endpoints whose path
// names no model).
var endpointPaths = [epGeminiGenerate]string{"/chat/completions", "/messages", "/messages/count_tokens", "/responses", "/embeddings", "/completions"}

// nativeEndpoint is where a request of api goes on a native upstream
// (Gemini's stream goes to epGeminiStream: encodeGeminiNative).
var nativeEndpoint = [numAPIs]endpoint{epChat, epMessages, epResponses, epEmbeddings, epCompletions, epGeminiGenerate}

// ownHeaders are the headers a request the proxy makes itself (the model
// list of the start-up path check) carries to an upstream serving the api
// natively; a client's requests carry the client's own. Anthropic's API
// refuses a request without a version.
var ownHeaders = [numAPIs][][2]string{
	apiMessages: {{"Anthropic-Version", anthropicVersion}},
}

// authHeaders maps a provider's auth to the header its key goes in, and
// whether the value is "Bearer <key>".
var authHeaders = map[string]struct {
	name   string
	bearer bool
}{
	"":          {"Authorization", true},
	"bearer":    {"Authorization", true},
	"x-api-key": {http.CanonicalHeaderKey("x-api-key"), false},
	"api-key":   {http.CanonicalHeaderKey("api-key"), false},
	// Google's Gemini API.
	"x-goog-api-key": {http.CanonicalHeaderKey("x-goog-api-key"), false},
}

// canServe reports whether an upstream serving apis can answer a request
// of api a: natively, or translated to chat when a's codec translates
// (Messages, Responses, Gemini; chat, embeddings and completions never
// are).
func (s apiSet) canServe(a api) bool {
	return s.has(a) || s.has(apiChat) && codecs[a].viaChat()
}

// servingAPI is rt restricted to the targets whose upstream can serve a: rt
// itself when all can, nil when none can. The targets are copies sharing the
// upstreams (slots, backoff) and the metric counters.
func (rt *route) servingAPI(a api) *route {
	sub := *rt
	sub.targets = nil
	for _, t := range rt.targets {
		if t.up.apis.canServe(a) {
			sub.targets = append(sub.targets, t)
		}
	}
	switch len(sub.targets) {
	case 0:
		return nil
	case len(rt.targets):
		return rt
	}
	return &sub
}
