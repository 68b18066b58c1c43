package adapter

import (
	"bytes"
	"encoding/json"
	"mime"
	"sync"
)

// wireTap reads from the wire what the client library drops. The go-sdk
// decodes tools/list into mcp.Tool, which has no field for a tool's
// execution properties (MCP 2025-11-25: execution.taskSupport), yet a
// reviewer must see them: a tool that requires task-augmented calls
// cannot be called as a plain tools/call. During discovery the meter
// hands every complete inbound JSON-RPC message to the tap before the
// client library reads it, so the tap knows a listing's execution
// properties by the time the library returns that listing.
type wireTap struct {
	mu        sync.Mutex
	execution map[string]json.RawMessage
}

func newWireTap() *wireTap { return &wireTap{execution: map[string]json.RawMessage{}} }

// reset forgets what earlier listings said.
func (w *wireTap) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.execution)
}

// message reads one inbound JSON-RPC message. Only a response whose result
// lists tools (tools/list: discovery sends no other request that returns
// tools) is kept; anything else, including what does not parse, is left
// to the client library to judge.
func (w *wireTap) message(msg []byte) {
	var resp struct {
		Result *struct {
			Tools []struct {
				Name      string          `json:"name"`
				Execution json.RawMessage `json:"execution"`
			} `json:"tools"`
		} `json:"result"`
	}
	if json.Unmarshal(msg, &resp) != nil || resp.Result == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range resp.Result.Tools {
		if len(t.Execution) == 0 || bytes.Equal(bytes.TrimSpace(t.Execution), []byte("null")) {
			delete(w.execution, t.Name)
			continue
		}
		w.execution[t.Name] = t.Execution
	}
}

// executionOf returns the execution properties the latest listing gave
// the tool, or nil.
func (w *wireTap) executionOf(name string) json.RawMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.execution[name]
}

// framer splits a byte stream into JSON-RPC messages for a tap. feed sees
// every byte read, in order, before the reader returns them; end marks the
// end of the stream.
type framer interface {
	feed(p []byte)
	end()
}

// lineFramer frames newline-delimited messages (stdio).
type lineFramer struct {
	tap *wireTap
	buf bytes.Buffer
}

func (f *lineFramer) feed(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			f.buf.Write(p)
			return
		}
		f.buf.Write(p[:i])
		f.tap.message(f.buf.Bytes())
		f.buf.Reset()
		p = p[i+1:]
	}
}

func (f *lineFramer) end() {
	if f.buf.Len() > 0 {
		f.tap.message(f.buf.Bytes())
		f.buf.Reset()
	}
}

// bodyFramer frames a JSON response body: one message, complete at EOF.
type bodyFramer struct {
	tap *wireTap
	buf bytes.Buffer
}

func (f *bodyFramer) feed(p []byte) { f.buf.Write(p) }

func (f *bodyFramer) end() {
	f.tap.message(f.buf.Bytes())
	f.buf.Reset()
}

// sseFramer frames a text/event-stream body: each event's data lines,
// joined by newlines, are one message, complete at the blank line that
// ends the event.
type sseFramer struct {
	tap  *wireTap
	line bytes.Buffer
	data bytes.Buffer
	some bool // the current event has a data field
}

func (f *sseFramer) feed(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			f.line.Write(p)
			return
		}
		f.line.Write(p[:i])
		f.field(bytes.TrimSuffix(f.line.Bytes(), []byte("\r")))
		f.line.Reset()
		p = p[i+1:]
	}
}

// field handles one line of the stream.
func (f *sseFramer) field(line []byte) {
	if len(line) == 0 {
		f.dispatch()
		return
	}
	value, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return // comments, event names, ids and retry hints carry no message
	}
	if f.some {
		f.data.WriteByte('\n')
	}
	f.data.Write(bytes.TrimPrefix(value, []byte(" ")))
	f.some = true
}

func (f *sseFramer) dispatch() {
	if f.some {
		f.tap.message(f.data.Bytes())
	}
	f.data.Reset()
	f.some = false
}

func (f *sseFramer) end() {
	if f.line.Len() > 0 {
		f.field(bytes.TrimSuffix(f.line.Bytes(), []byte("\r")))
		f.line.Reset()
	}
	f.dispatch()
}

// bodyFramerFor returns the framer for an HTTP response body of the given
// Content-Type, or nil when the body holds no JSON-RPC message.
func bodyFramerFor(tap *wireTap, contentType string) framer {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch mt {
	case "application/json":
		return &bodyFramer{tap: tap}
	case "text/event-stream":
		return &sseFramer{tap: tap}
	}
	return nil
}
