package llmroute

import (
	"strings"
	"testing"
)

// The final-event markers of native Messages and Responses streams: found
// at a line start across writes, never inside an event's data, and the
// stream is finished only once the final event's data ended.
func TestNativeEndMarkers(t *testing.T) {
	stop := "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	textWithMarker := "event: content_block_delta\ndata: {\"delta\":{\"text\":\"event: message_stop\"}}\n\n"
	completed := "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n"
	for _, tc := range []struct {
		name   string
		a      api
		writes []string
		done   bool
		fin    bool
	}{
		{"messages whole", apiMessages, []string{textWithMarker + stop}, true, true},
		{"messages byte by byte", apiMessages, strings.Split(textWithMarker+stop, ""), true, true},
		{"messages marker in text only", apiMessages, []string{textWithMarker}, false, false},
		{"messages name line only", apiMessages, []string{textWithMarker, "event: message_stop\n"}, true, false},
		{"messages data cut", apiMessages, []string{textWithMarker, stop[:30]}, true, false},
		{"messages [DONE] is not the end", apiMessages, []string{"data: [DONE]\n\n"}, false, false},
		{"responses completed", apiResponses, []string{"event: response.created\ndata: {}\n\n", completed}, true, true},
		{"responses completed split", apiResponses, []string{completed[:12], completed[12:]}, true, true},
		{"responses incomplete", apiResponses, []string{"event: response.incomplete\ndata: {}\n\n"}, true, true},
		// The upstream's own failure event ends its stream: no error event
		// of the proxy's follows it.
		{"responses failed", apiResponses, []string{"event: response.failed\ndata: {}\n\n"}, true, true},
		{"responses error", apiResponses, []string{"event: error\ndata: {}\n\n"}, true, true},
		{"messages error", apiMessages, []string{"event: error\ndata: {}\n\n"}, true, true},
		{"messages error in text only", apiMessages, []string{"event: content_block_delta\ndata: {\"delta\":{\"text\":\"event: error\"}}\n\n"}, false, false},
		{"chat", apiChat, []string{"data: {}\n\n", "data: [DONE]\n\n"}, true, true},
	} {
		var c clientWriter
		c.shape = codecs[tc.a].shape()
		for _, w := range tc.writes {
			c.noteDone([]byte(w))
			c.trackBoundary([]byte(w))
		}
		if c.done != tc.done || c.finished() != tc.fin {
			t.Errorf("%s: done %v finished %v, want %v %v", tc.name, c.done, c.finished(), tc.done, tc.fin)
		}
	}
}

// The carry that finds a marker split over two writes holds the longest
// marker of every API's stream shape.
func TestShapeMarkersFitCarry(t *testing.T) {
	for a, c := range codecs {
		for _, m := range c.shape().markers {
			if len(m) > maxMarkerLen {
				t.Errorf("%s: marker %q is longer than maxMarkerLen %d", api(a), m, maxMarkerLen)
			}
		}
	}
}
