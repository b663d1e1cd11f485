package edge

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The request timeout covers the time to response headers only: these streams outlive
// a 300 ms timeout by far.
const shortTimeout = 300 * time.Millisecond

func TestWebSocketPassesThroughAndOutlivesTheTimeout(t *testing.T) {
	te := startEdge(t, nil)
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, shortTimeout, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			typ, msg, err := ws.Read(r.Context())
			if err != nil {
				return
			}
			if err := ws.Write(r.Context(), typ, append([]byte("echo: "), msg...)); err != nil {
				return
			}
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// WebSocket upgrades are HTTP/1.1 (RFC 6455); a client offering only that gets it.
	ws, _, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(url, "https"), &websocket.DialOptions{HTTPClient: te.client("http/1.1")}) //nolint:bodyclose // the upgraded connection is ws
	if err != nil {
		t.Fatalf("dial through the edge: %v", err)
	}
	defer ws.CloseNow()
	for i := range 3 {
		if i == 2 {
			time.Sleep(2 * shortTimeout)
		}
		want := fmt.Sprintf("echo: message %d", i)
		if err := ws.Write(ctx, websocket.MessageText, []byte(want[len("echo: "):])); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		_, got, err := ws.Read(ctx)
		if err != nil || string(got) != want {
			t.Fatalf("read %d: %q, %v; want %q", i, got, err, want)
		}
	}
	if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestServerSentEventsAreFlushedAtOnce(t *testing.T) {
	te := startEdge(t, nil)
	next := make(chan struct{})
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, shortTimeout, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			if i > 0 { // the next event only once the client has seen the last one
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprintf(w, "data: event %d\n\n", i)
			w.(http.Flusher).Flush()
		}
	}))
	for _, proto := range []string{"h2", "http/1.1"} {
		t.Run(proto, func(t *testing.T) {
			res, err := te.client(proto).Get(url)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			lines := bufio.NewScanner(res.Body)
			for i := range 3 {
				var got string
				for got == "" && lines.Scan() {
					got = lines.Text()
				}
				if want := fmt.Sprintf("data: event %d", i); got != want {
					t.Fatalf("event %d: got %q (%v), want %q", i, got, lines.Err(), want)
				}
				if i == 1 {
					time.Sleep(2 * shortTimeout) // longer than the request timeout
				}
				if i < 2 {
					signal(t, next)
				}
			}
		})
	}
}

// signal tells the backend to go on, failing instead of hanging if it is gone.
func signal(t *testing.T, next chan<- struct{}) {
	t.Helper()
	select {
	case next <- struct{}{}:
	case <-time.After(5 * time.Second):
		t.Fatal("the backend stopped waiting: the stream was cut")
	}
}
