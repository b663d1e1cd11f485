// Package logstore is the append-only log of a sandbox's main command.
//
// A log named N in a directory is two files:
//
//	N.log  the raw bytes, in the order they were written
//	N.idx  one fixed-size record per write (RecordSize bytes, little endian):
//	       offset uint64 | unix nanos int64 | length uint32 | stream uint8 | 3 zero bytes
//
// The writer appends the data first and the record second, so a record never points at
// bytes that are not there yet. Readers ignore a torn (partial) last record and any record
// that does not continue the previous one or points beyond the end of the log, so a crash
// mid-write loses at most the last chunk.
//
// The agent owns the Writer and serves reads (with Follow for live tails); the runner opens
// a Reader on the host copy of the state dir after the sandbox has exited.
package logstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RecordSize is the size of one index record.
const RecordSize = 24

// Stream says which output a chunk came from. The values match sandboxd.agent.v1.Stream.
type Stream uint8

// Streams. Combined is stdout and stderr of one pipe (as with 2>&1): the agent gives the
// main command one pipe for both, because two pipes read side by side lose the order in
// which the command wrote to them.
const (
	Combined Stream = 0
	Stdout   Stream = 1
	Stderr   Stream = 2
)

// Chunk is one write to the log.
type Chunk struct {
	Offset uint64 // byte offset of Data[0] in the log
	Time   time.Time
	Stream Stream
	Data   []byte // valid only during the callback
}

// NextOffset is the offset just after the chunk.
func (c Chunk) NextOffset() uint64 { return c.Offset + uint64(len(c.Data)) }

type record struct {
	off    uint64
	nanos  int64
	length uint32
	stream Stream
}

func (r record) end() uint64 { return r.off + uint64(r.length) }

func encodeRecord(b []byte, r record) {
	binary.LittleEndian.PutUint64(b[0:8], r.off)
	binary.LittleEndian.PutUint64(b[8:16], uint64(r.nanos))
	binary.LittleEndian.PutUint32(b[16:20], r.length)
	b[20] = byte(r.stream)
	b[21], b[22], b[23] = 0, 0, 0
}

func decodeRecord(b []byte) record {
	return record{
		off:    binary.LittleEndian.Uint64(b[0:8]),
		nanos:  int64(binary.LittleEndian.Uint64(b[8:16])),
		length: binary.LittleEndian.Uint32(b[16:20]),
		stream: Stream(b[20]),
	}
}

// MaxChunk is the largest chunk a record may describe: Write splits larger writes, and a
// reader refuses a record beyond it, so a forged index cannot make it buffer more.
const MaxChunk = 1 << 20

// validPrefix returns how many bytes of b (index records from a record boundary) are
// valid records continuing a log that ends at end with its last chunk written at nanos:
// each starts where the previous one ended, is 1..MaxChunk bytes long, lies within the
// first logSize bytes, and is not older than the one before. It also returns the end and
// time of the last valid record.
func validPrefix(b []byte, end uint64, nanos int64, logSize uint64) (int, uint64, int64) {
	n := 0
	for len(b)-n >= RecordSize {
		r := decodeRecord(b[n : n+RecordSize])
		if r.off != end || r.length == 0 || r.length > MaxChunk || r.end() > logSize || r.nanos < nanos {
			break
		}
		end, nanos = r.end(), r.nanos
		n += RecordSize
	}
	return n, end, nanos
}

// IndexPath is the path of log name's index in dir, which Open creates (with the log)
// if it is not there.
func IndexPath(dir, name string) string {
	_, ip := paths(dir, name)
	return ip
}

func paths(dir, name string) (string, string) {
	return filepath.Join(dir, name+".log"), filepath.Join(dir, name+".idx")
}

// Writer appends to a log. It is safe for concurrent use.
type Writer struct {
	mu        sync.Mutex
	log, idx  *os.File
	end       uint64
	lastNanos int64
	closed    bool
	changed   chan struct{} // closed and replaced on every write and on Close
	rec       [RecordSize]byte
	now       func() time.Time
}

// Open opens (creating dir and files as needed) the log name in dir for appending. An
// existing log is kept; a torn tail left by a crash is cut off.
func Open(dir, name string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lp, ip := paths(dir, name)
	log, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	idx, err := os.OpenFile(ip, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		log.Close()
		return nil, err
	}
	w := &Writer{log: log, idx: idx, changed: make(chan struct{}), now: time.Now}
	if err := w.recover(); err != nil {
		log.Close()
		idx.Close()
		return nil, fmt.Errorf("logstore: recover %s: %w", lp, err)
	}
	return w, nil
}

func (w *Writer) recover() error {
	li, err := w.log.Stat()
	if err != nil {
		return err
	}
	b, err := io.ReadAll(w.idx)
	if err != nil {
		return err
	}
	n, end, nanos := validPrefix(b, 0, 0, uint64(li.Size()))
	w.lastNanos = nanos
	// Only what is cut: a truncate to the size a file has still changes its times (a
	// journal transaction each, at every agent's start on two new, empty files).
	if n < len(b) {
		if err := w.idx.Truncate(int64(n)); err != nil {
			return err
		}
	}
	if end < uint64(li.Size()) {
		if err := w.log.Truncate(int64(end)); err != nil {
			return err
		}
	}
	if _, err := w.idx.Seek(int64(n), io.SeekStart); err != nil {
		return err
	}
	if _, err := w.log.Seek(int64(end), io.SeekStart); err != nil {
		return err
	}
	w.end = end
	return nil
}

// Write appends p as one chunk of stream s. Large writes are split into chunks of at most
// 1 MiB so every record stays small to read.
func (w *Writer) Write(s Stream, p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, os.ErrClosed
	}
	written := 0
	for len(p) > 0 {
		n := min(len(p), MaxChunk)
		if _, err := w.log.Write(p[:n]); err != nil {
			return written, err
		}
		nanos := w.now().UnixNano()
		if nanos <= w.lastNanos {
			// Strictly increasing: since-searches bisect, and a since at a chunk's own
			// time never starts at an earlier chunk, even within one clock tick or when
			// the wall clock steps back.
			nanos = w.lastNanos + 1
		}
		w.lastNanos = nanos
		encodeRecord(w.rec[:], record{off: w.end, nanos: nanos, length: uint32(n), stream: s})
		if _, err := w.idx.Write(w.rec[:]); err != nil {
			return written, err
		}
		w.end += uint64(n)
		written += n
		p = p[n:]
	}
	if written > 0 {
		close(w.changed)
		w.changed = make(chan struct{})
	}
	return written, nil
}

// StreamWriter returns an io.Writer that appends to stream s.
func (w *Writer) StreamWriter(s Stream) io.Writer { return streamWriter{w, s} }

type streamWriter struct {
	w *Writer
	s Stream
}

func (sw streamWriter) Write(p []byte) (int, error) { return sw.w.Write(sw.s, p) }

// Size is the number of bytes written so far.
func (w *Writer) Size() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.end
}

// Changed returns a channel closed on the next write or on Close, and whether the writer
// is already closed. Take it before reading to not miss a write.
func (w *Writer) Changed() (<-chan struct{}, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed, w.closed
}

// Close flushes the log to disk and ends every Follow once it has read everything.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	close(w.changed)
	err := errors.Join(w.log.Sync(), w.idx.Sync())
	return errors.Join(err, w.log.Close(), w.idx.Close())
}

// ReadOptions select where a read starts. When several are set, the latest start wins.
type ReadOptions struct {
	TailLines  int       // > 0: start at the last TailLines lines
	Since      time.Time // non-zero: start at the first chunk written at or after Since
	Offset     uint64    // with FromOffset: start at this byte offset
	FromOffset bool
}

// Reader reads a log. It picks up records appended after it was opened. It is not safe
// for concurrent use.
//
// Its memory stays bounded whatever the files hold (the runner reads logs a sandbox
// wrote): it keeps no list of records but reads them from the index as it needs them,
// trusting only the prefix of the index it checked (validPrefix).
type Reader struct {
	log, idx *os.File
	n        int64  // records in the checked prefix of the index
	end      uint64 // offset after the last of them
	nanos    int64  // time of the last of them
	block    []byte // index bytes being read
	recs     []record
	buf      []byte // log bytes being passed on
}

// blockRecords is how many index records a Reader reads at once, at most; it starts
// with minBlockRecords.
const (
	blockRecords    = 4096
	minBlockRecords = 64
)

// grow returns b with length n, on b's array when that is large enough, else on a new
// one at least twice as large, up to limit (n at most).
func grow(b []byte, n, limit int) []byte {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n, max(n, min(2*cap(b), limit)))
}

// OpenReader opens the log name in dir for reading. Both files must be regular files,
// and neither they nor dir itself may be a symlink: none is followed. (The path above
// dir is resolved as it is: OpenReaderBeneath is for logs below a directory that their
// sandbox can write.)
func OpenReader(dir, name string) (*Reader, error) {
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathError(dir, err)
	}
	defer unix.Close(d)
	return openIn(d, dir, name, func(d int, p string) (int, error) {
		return unix.Openat(d, p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	})
}

// OpenReaderBeneath opens the log name in the directory rel beneath root, for a log that
// an untrusted party (its sandbox) could write: root is trusted and resolved as it is;
// rel and the files are resolved beneath it refusing every symlink on the way (openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), so a log dir the sandbox replaced by a symlink
// (to another sandbox's logs or a host path) is an error, never read. The host's
// reader of such logs uses it; it needs openat2 (Linux 5.6), which an agent inside a
// sandbox (gVisor) may not have, hence OpenReader for that side.
func OpenReaderBeneath(root, rel, name string) (*Reader, error) {
	r, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathError(root, err)
	}
	defer unix.Close(r)
	how := func(flags uint64) *unix.OpenHow {
		return &unix.OpenHow{Flags: flags | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	}
	dir := filepath.Join(root, rel)
	d, err := unix.Openat2(r, rel, how(unix.O_PATH|unix.O_DIRECTORY))
	if err != nil {
		return nil, pathError(dir, err)
	}
	defer unix.Close(d)
	return openIn(d, dir, name, func(d int, p string) (int, error) {
		return unix.Openat2(d, p, how(unix.O_RDONLY|unix.O_NONBLOCK))
	})
}

// openIn opens the log name in the directory d (at path dir, for messages) with open.
func openIn(d int, dir, name string, open func(int, string) (int, error)) (*Reader, error) {
	lp, ip := paths(dir, name)
	log, err := openRegular(d, lp, open)
	if err != nil {
		return nil, err
	}
	idx, err := openRegular(d, ip, open)
	if err != nil {
		log.Close()
		return nil, err
	}
	return &Reader{log: log, idx: idx}, nil
}

func openRegular(d int, p string, open func(int, string) (int, error)) (*os.File, error) {
	fd, err := open(d, filepath.Base(p))
	if err != nil {
		return nil, pathError(p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("logstore: %s is not a regular file", p)
	}
	return f, nil
}

// pathError is err of opening p, with a symlink that was not followed said so.
func pathError(p string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return &fs.PathError{Op: "open", Path: p, Err: fmt.Errorf("%w: a symlink (or a path leaving its directory), not followed", err)}
	}
	return &fs.PathError{Op: "open", Path: p, Err: err}
}

// Close releases the files.
func (r *Reader) Close() error { return errors.Join(r.log.Close(), r.idx.Close()) }

// refresh extends the checked prefix by the records appended since the last call.
func (r *Reader) refresh() error {
	li, err := r.log.Stat()
	if err != nil {
		return err
	}
	// The block grows from minBlockRecords as the index proves long: a reader of a short
	// log stays small (an agent holds one per log stream).
	size := max(cap(r.block), minBlockRecords*RecordSize)
	for {
		r.block = grow(r.block, size, blockRecords*RecordSize)
		n, err := r.idx.ReadAt(r.block, r.n*RecordSize)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		used, end, nanos := validPrefix(r.block[:n-n%RecordSize], r.end, r.nanos, uint64(li.Size()))
		r.n += int64(used / RecordSize)
		r.end, r.nanos = end, nanos
		if used < len(r.block) {
			return nil // the end of the index, a torn record, or one that is not valid
		}
		size = min(2*size, blockRecords*RecordSize)
	}
}

// records reads up to blockRecords checked records from index i on.
func (r *Reader) records(i int64) ([]record, error) {
	k := min(r.n-i, blockRecords)
	if k <= 0 {
		return nil, nil
	}
	r.block = grow(r.block, int(k)*RecordSize, blockRecords*RecordSize)
	b := r.block
	if _, err := r.idx.ReadAt(b, i*RecordSize); err != nil {
		return nil, err
	}
	// Checked once, but the file may have changed since (a live log's own sandbox can
	// write it): check again, so a read never goes beyond what the records allow.
	first := decodeRecord(b)
	if used, _, _ := validPrefix(b, first.off, first.nanos, r.end); used != len(b) {
		return nil, fmt.Errorf("logstore: %s changed under the reader", r.idx.Name())
	}
	r.recs = r.recs[:0]
	for j := 0; j < len(b); j += RecordSize {
		r.recs = append(r.recs, decodeRecord(b[j:j+RecordSize]))
	}
	return r.recs, nil
}

// search returns the first checked record for which f is true (f must be false and
// then true along the log), or r.n.
func (r *Reader) search(f func(record) bool) (int64, error) {
	var rec [RecordSize]byte
	var rerr error
	lo, hi := int64(0), r.n
	for lo < hi {
		m := int64(uint64(lo+hi) >> 1)
		if _, err := r.idx.ReadAt(rec[:], m*RecordSize); err != nil {
			rerr = err
			break
		}
		if !f(decodeRecord(rec[:])) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, rerr
}

// keptBytes bounds what a Reader keeps of its buffers between reads: a follower waits
// for more of its log holding at most this much of them, however large the log (an agent
// holds one Reader per log stream, in its sandbox's memory).
const keptBytes = 64 << 10

// trim drops the buffers that grew beyond keptBytes.
func (r *Reader) trim() {
	if cap(r.buf) > keptBytes {
		r.buf = nil
	}
	if cap(r.block) > keptBytes {
		r.block = nil
	}
	if cap(r.recs)*int(unsafe.Sizeof(record{})) > keptBytes {
		r.recs = nil
	}
}

// End is the offset just after the last complete chunk.
func (r *Reader) End() (uint64, error) {
	if err := r.refresh(); err != nil {
		return 0, err
	}
	return r.end, nil
}

// Read calls fn for every chunk from the start selected by opts to the current end, and
// returns the offset after the last byte it passed on (the FromOffset start of a later
// read). A chunk cut by the start is passed from the start on. An error from fn stops
// the read and is returned.
func (r *Reader) Read(opts ReadOptions, fn func(Chunk) error) (uint64, error) {
	defer r.trim()
	if err := r.refresh(); err != nil {
		return 0, err
	}
	start := uint64(0)
	if opts.FromOffset {
		start = max(start, min(opts.Offset, r.end))
	}
	if !opts.Since.IsZero() {
		s := opts.Since.UnixNano()
		i, err := r.search(func(rec record) bool { return rec.nanos >= s })
		if err != nil {
			return 0, err
		}
		if i == r.n {
			start = r.end
		} else {
			rec, err := r.records(i)
			if err != nil {
				return 0, err
			}
			start = max(start, rec[0].off)
		}
	}
	if opts.TailLines > 0 {
		t, err := r.tailStart(opts.TailLines)
		if err != nil {
			return 0, err
		}
		start = max(start, t)
	}
	return r.emit(start, fn)
}

// tailStart finds the offset of the first of the last n lines. A final line without a
// newline counts as a line.
func (r *Reader) tailStart(n int) (uint64, error) {
	end := r.end
	if end == 0 {
		return 0, nil
	}
	var last [1]byte
	if _, err := r.log.ReadAt(last[:], int64(end-1)); err != nil {
		return 0, err
	}
	pos := end
	if last[0] == '\n' {
		pos-- // the trailing newline ends the last line; it does not start one
	}
	const block = 64 << 10
	buf := make([]byte, block)
	for pos > 0 {
		size := min(uint64(block), pos)
		b := buf[:size]
		if _, err := r.log.ReadAt(b, int64(pos-size)); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] == '\n' {
				n--
				if n == 0 {
					return pos - size + uint64(i) + 1, nil
				}
			}
		}
		pos -= size
	}
	return 0, nil
}

// emit passes the chunks from start to the end, reading the log in spans of up to
// MaxChunk bytes.
func (r *Reader) emit(start uint64, fn func(Chunk) error) (uint64, error) {
	if start >= r.end {
		return r.end, nil
	}
	i, err := r.search(func(rec record) bool { return rec.end() > start })
	if err != nil {
		return start, err
	}
	next := start
	for i < r.n {
		recs, err := r.records(i)
		if err != nil {
			return next, err
		}
		for len(recs) > 0 {
			// Gather records [0, j) into one read of at most MaxChunk bytes.
			j := 1
			for j < len(recs) && recs[j].end()-recs[0].off <= MaxChunk {
				j++
			}
			from, to := recs[0].off, recs[j-1].end()
			r.buf = grow(r.buf, int(to-from), MaxChunk)
			b := r.buf
			if _, err := r.log.ReadAt(b, int64(from)); err != nil && !errors.Is(err, io.EOF) {
				return next, err
			}
			for _, rec := range recs[:j] {
				if rec.end() <= start {
					continue // only with an index that changed under the search
				}
				data := b[rec.off-from : rec.end()-from]
				off := rec.off
				if off < start {
					data = data[start-off:]
					off = start
				}
				if err := fn(Chunk{Offset: off, Time: time.Unix(0, rec.nanos), Stream: rec.stream, Data: data}); err != nil {
					return next, err
				}
				next = rec.end()
			}
			recs = recs[j:]
			i += int64(j)
		}
	}
	return next, nil
}

// Follow reads like Read and then keeps passing chunks as w appends them, until w is
// closed and everything was passed on (returns nil), ctx ends (returns ctx.Err()), or fn
// fails. w must be the writer of the log r reads; nil means the log is complete.
func Follow(ctx context.Context, r *Reader, w *Writer, opts ReadOptions, fn func(Chunk) error) error {
	for {
		var (
			changed <-chan struct{}
			closed  = true
		)
		if w != nil {
			changed, closed = w.Changed()
		}
		next, err := r.Read(opts, fn)
		if err != nil {
			return err
		}
		if closed {
			return nil
		}
		opts = ReadOptions{Offset: next, FromOffset: true}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
