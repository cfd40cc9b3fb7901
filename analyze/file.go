package analyze

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// FileSource reads records from a file, one a line, in one of two forms,
// told apart line by line:
//
//   - kcat's -J envelope: a JSON object with the members "topic",
//     "partition", "offset" and "payload" (a string, or null for a
//     tombstone), and optionally "key" (a string or null), "ts" (the
//     timestamp in milliseconds) and "headers" (kcat's list of names and
//     values, ["name","value",...], or a list of {"key":..,"value":..}
//     objects);
//   - a record value, its key before it and a tab when the line holds a
//     tab (KEY<TAB>VALUE, as `kcat -C -K '\t'` prints records), else the
//     whole line without a key. WithoutKeys reads every line as a value.
//
// Records without a topic are given the source's topic (the one route's
// input), and so is every record with AllToTopic. Empty lines are
// skipped.
type FileSource struct {
	path     string // "" for in
	in       io.Reader
	topic    string
	maxLine  int
	noKeys   bool
	allTo    bool
	lines    int64 // lines passed to fn by the first Read (-1: until then)
	readOnce bool
}

// NewFileSource returns a source reading the file at path, records
// without a topic going to topic; a line longer than maxLine bytes is an
// error (its record could not be decided: it is larger than any route's
// max_size).
func NewFileSource(path, topic string, maxLine int) *FileSource {
	return &FileSource{path: path, topic: topic, maxLine: maxLine, lines: -1}
}

// NewReaderSource is NewFileSource reading in, once (standard input): no
// what-if runs.
func NewReaderSource(in io.Reader, topic string, maxLine int) *FileSource {
	return &FileSource{in: in, topic: topic, maxLine: maxLine, lines: -1}
}

// AllToTopic gives every record the source's topic, an envelope's too:
// for one route, whatever topic the records were dumped from.
func (f *FileSource) AllToTopic() *FileSource { f.allTo = true; return f }

// WithoutKeys makes the source read each plain line whole as a value,
// tabs included, without a key.
func (f *FileSource) WithoutKeys() *FileSource { f.noKeys = true; return f }

// Rereadable: a named file can be read again, standard input not.
func (f *FileSource) Rereadable() bool { return f.in == nil }

// Where returns the record's line, and its topic/partition@offset when the
// line is a kcat envelope.
func (f *FileSource) Where(r *kgo.Record) string {
	at := fmt.Sprintf("%s:%d", f.name(), lineOf(r))
	if r.Partition >= 0 {
		at += fmt.Sprintf(" (partition %d, offset %d)", r.Partition, r.Offset)
	}
	return at
}

// lineKey marks, in a record's Context, the line it was read from.
type lineKey struct{}

func lineOf(r *kgo.Record) int64 {
	if r.Context == nil {
		return 0
	}
	n, _ := r.Context.Value(lineKey{}).(int64)
	return n
}

// ErrLineTooLong: a line of the file is longer than the source's limit.
var ErrLineTooLong = errors.New("analyze: line too long")

// fileRun is how many records a FileSource passes at once.
const fileRun = 512

// Read reads the file; a later Read reads the lines the first passed to
// fn (see Source).
func (f *FileSource) Read(ctx context.Context, _ []string, fn func([]*kgo.Record) (int, error)) error {
	in := f.in
	if in == nil {
		file, err := os.Open(f.path)
		if err != nil {
			return err
		}
		defer file.Close()
		in = file
	} else if f.readOnce {
		return errors.New("analyze: standard input cannot be read twice")
	}
	f.readOnce = true
	first := f.lines < 0
	br := bufio.NewReaderSize(in, 64<<10)
	var line []byte
	var n int64 // lines read
	run := make([]*kgo.Record, 0, fileRun)
	// flush passes the run to fn; it reports whether the reading ends
	// (and with what).
	flush := func(end bool) (bool, error) {
		if len(run) == 0 {
			if end && first {
				f.lines = n
			}
			return end, nil
		}
		took, err := fn(run)
		if err != nil {
			if first {
				f.lines = lineOf(run[0]) - 1 // the lines before the run
				if took > 0 {
					f.lines = lineOf(run[took-1])
				}
			}
			if errors.Is(err, ErrStop) {
				return true, nil
			}
			return true, err
		}
		run = run[:0]
		if err := ctx.Err(); err != nil {
			return true, err
		}
		if end && first {
			f.lines = n
		}
		return end, nil
	}
	// fail ends the reading at a line that cannot be read, once fn has
	// had the records before it: fn may stop before the line, and the
	// reading then ends as if the input had.
	fail := func(err error) error {
		if done, ferr := flush(false); done {
			return ferr
		}
		return err
	}
	live := isLive(in)
	for {
		if !first && n == f.lines {
			_, err := flush(true)
			return err
		}
		// Input that arrives as it is written (a pipe): the records read
		// go to fn before the reading waits for more, which may never
		// come, while fn would stop before it.
		if live && len(run) > 0 && !lineBuffered(br) {
			if done, err := flush(false); done {
				return err
			}
		}
		var err error
		line, err = readLine(br, line[:0], f.maxLine)
		if errors.Is(err, io.EOF) && len(line) == 0 {
			_, err := flush(true)
			return err
		}
		n++
		if errors.Is(err, ErrLineTooLong) {
			return fail(fmt.Errorf("%s line %d: %w (over %d bytes)", f.name(), n, err, f.maxLine))
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fail(err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		r, perr := f.parse(line, n)
		if perr != nil {
			return fail(fmt.Errorf("%s line %d: %w", f.name(), n, perr))
		}
		run = append(run, r)
		if len(run) == fileRun {
			if done, err := flush(false); done {
				return err
			}
		}
	}
}

// isLive reports whether in may be waiting for input still to be written
// (a pipe, a terminal), unlike a regular file, read as fast as it is
// asked.
func isLive(in io.Reader) bool {
	if st, ok := in.(interface{ Stat() (os.FileInfo, error) }); ok {
		if fi, err := st.Stat(); err == nil && fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// lineBuffered reports whether br holds a whole line: reading it does not
// wait for the input.
func lineBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

func (f *FileSource) name() string {
	if f.path == "" {
		return "stdin"
	}
	return f.path
}

// readLine appends the next line to dst, without its newline (and CR).
func readLine(br *bufio.Reader, dst []byte, limit int) ([]byte, error) {
	for {
		chunk, err := br.ReadSlice('\n')
		dst = append(dst, chunk...)
		if len(dst) > limit+2 {
			// Drain the rest of the line: the error names it.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			return dst[:0], ErrLineTooLong
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		dst = bytes.TrimSuffix(dst, []byte("\n"))
		dst = bytes.TrimSuffix(dst, []byte("\r"))
		return dst, err
	}
}

// envelope is kcat's -J record.
type envelope struct {
	Topic     *string         `json:"topic"`
	Partition *int32          `json:"partition"`
	Offset    *int64          `json:"offset"`
	Key       *string         `json:"key"`
	Payload   json.RawMessage `json:"payload"`
	TS        *int64          `json:"ts"`
	Headers   json.RawMessage `json:"headers"`
}

// parse makes line n a record. A plain line's record has partition -1
// and its line number as its offset; an envelope's has its own.
func (f *FileSource) parse(line []byte, n int64) (*kgo.Record, error) {
	r := &kgo.Record{Topic: f.topic, Partition: -1, Offset: n, Context: context.WithValue(context.Background(), lineKey{}, n)}
	if t := bytes.TrimLeft(line, " \t"); len(t) > 0 && t[0] == '{' && bytes.Contains(t, []byte(`"payload"`)) {
		var e envelope
		if json.Unmarshal(t, &e) == nil && e.Topic != nil && e.Partition != nil && e.Offset != nil && len(e.Payload) > 0 {
			return f.fromEnvelope(r, &e)
		}
	}
	key, value := []byte(nil), line
	if !f.noKeys {
		if i := bytes.IndexByte(line, '\t'); i >= 0 {
			key, value = line[:i:i], line[i+1:]
		}
	}
	r.Key = bytes.Clone(key)
	r.Value = bytes.Clone(value)
	return r, nil
}

func (f *FileSource) fromEnvelope(r *kgo.Record, e *envelope) (*kgo.Record, error) {
	r.Partition, r.Offset = *e.Partition, *e.Offset
	if !f.allTo {
		r.Topic = *e.Topic
	}
	if e.Key != nil {
		r.Key = []byte(*e.Key)
	}
	if string(e.Payload) != "null" {
		var v string
		if err := json.Unmarshal(e.Payload, &v); err != nil {
			return nil, fmt.Errorf("payload: want a string or null (kcat -J): %w", err)
		}
		r.Value = []byte(v)
	}
	if e.TS != nil && *e.TS > 0 {
		r.Timestamp = time.UnixMilli(*e.TS).UTC()
	}
	if len(e.Headers) == 0 || string(e.Headers) == "null" {
		return r, nil
	}
	var flat []*string // kcat: ["name", "value", ...]
	if err := json.Unmarshal(e.Headers, &flat); err == nil {
		if len(flat)%2 != 0 {
			return nil, errors.New("headers: a list of names and values has an odd length")
		}
		for i := 0; i < len(flat); i += 2 {
			if flat[i] == nil {
				return nil, errors.New("headers: a header without a name")
			}
			h := kgo.RecordHeader{Key: *flat[i]}
			if flat[i+1] != nil {
				h.Value = []byte(*flat[i+1])
			}
			r.Headers = append(r.Headers, h)
		}
		return r, nil
	}
	var objs []struct {
		Key   string  `json:"key"`
		Value *string `json:"value"`
	}
	if err := json.Unmarshal(e.Headers, &objs); err != nil {
		return nil, fmt.Errorf("headers: want [\"name\",\"value\",...] or [{\"key\":..,\"value\":..}]: %w", err)
	}
	for _, o := range objs {
		h := kgo.RecordHeader{Key: o.Key}
		if o.Value != nil {
			h.Value = []byte(*o.Value)
		}
		r.Headers = append(r.Headers, h)
	}
	return r, nil
}
