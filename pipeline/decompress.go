package pipeline

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Decompression is bounded twice, since a producer chooses both what a
// batch inflates to and how many batches a fetch holds (a 256 MiB run of
// one byte is 8 KB of zstd, under any max.message.bytes):
//
//   - a batch may inflate to pipeline.max_decompressed_batch_bytes: past
//     it, the batch is bad input for its offsets (ErrMaxDecompress, which
//     franz-go reports as *kgo.ErrDecompressTooLarge; fetch.go turns it
//     into a dead letter per offset, or a halt of that partition alone);
//   - the batches decompressed since the poll loop last took the fetched
//     records may inflate to pipeline.max_decompressed_fetch_bytes in all:
//     past it, a batch is refused for now (errFetchWindowFull), franz-go
//     returns the partition's batches before it and fetches it again after
//     the next poll, when the window is empty. The window is at least one
//     batch's cap, so a batch within the cap always fits an empty window.
//
// A source keeps one fetch buffered until it is polled whole, so what the
// fetches hold decompressed is at most twice the window (one polled in
// part, one fetched after it), plus one batch per broker being inflated.

// errFetchWindowFull refuses a batch while the fetches hold the window's
// worth of decompressed bytes: not bad input, fetched again later.
var errFetchWindowFull = errors.New("pipeline: the decompressed fetch window is full; the batch is fetched again after the next poll")

// boundedDecompressor is a kgo.Decompressor that never inflates a batch
// past its bound, whatever the codec and whatever the batch declares.
type boundedDecompressor struct {
	batchMax  int   // per batch
	windowMax int64 // per poll
	window    atomic.Int64

	gzip sync.Pool // *gzip.Reader
	lz4  sync.Pool // *lz4.Reader
	zstd sync.Pool // *zstd.Decoder
	bufs sync.Pool // *bytes.Buffer
}

func newBoundedDecompressor(batchMax, windowMax int) *boundedDecompressor {
	d := &boundedDecompressor{batchMax: batchMax, windowMax: int64(max(windowMax, batchMax))}
	d.lz4.New = func() any { return lz4.NewReader(nil) }
	// Streamed through a limit (readLimited), so a frame's declared size
	// is never trusted; the window, which the decoder allocates up front,
	// is bounded by the batch's cap.
	zopts := []zstd.DOption{zstd.WithDecoderLowmem(true), zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(uint64(batchMax) + 1),
		zstd.WithDecoderMaxWindow(min(max(uint64(batchMax), zstd.MinWindowSize), zstd.MaxWindowSize))}
	d.zstd.New = func() any {
		dec, err := zstd.NewReader(nil, zopts...)
		if err != nil {
			return err // options fixed above: reported by every Decompress
		}
		return dec
	}
	d.bufs.New = func() any { return new(bytes.Buffer) }
	return d
}

// polled empties the window: the poll loop has taken the fetched records
// (they count against the in-flight budget from now on).
func (d *boundedDecompressor) polled() { d.window.Store(0) }

// Decompress implements kgo.Decompressor.
func (d *boundedDecompressor) Decompress(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	if codec == kgo.CodecNone {
		return src, nil
	}
	limit := d.batchMax
	if room := d.windowMax - d.window.Load(); room < int64(limit) {
		limit = int(max(room, 0))
	}
	out, err := d.decode(src, codec, limit)
	switch {
	case errors.Is(err, errOverLimit) && limit == d.batchMax:
		return nil, fmt.Errorf("%w: the batch inflates past %d bytes (%s, %d bytes compressed)", kgo.ErrMaxDecompress, d.batchMax, codecName(codec), len(src))
	case errors.Is(err, errOverLimit):
		return nil, errFetchWindowFull
	case err != nil:
		return nil, err
	}
	d.window.Add(int64(len(out)))
	return out, nil
}

// errOverLimit: the output would exceed the limit of this call.
var errOverLimit = errors.New("pipeline: decompressed output over its limit")

// decode inflates src, or fails with errOverLimit past limit bytes, never
// holding more than limit+1 bytes of output.
func (d *boundedDecompressor) decode(src []byte, codec kgo.CompressionCodecType, limit int) ([]byte, error) {
	switch codec {
	case kgo.CodecSnappy:
		return decodeSnappy(src, limit)
	case kgo.CodecGzip:
		r, _ := d.gzip.Get().(*gzip.Reader)
		if r == nil {
			r = new(gzip.Reader)
		}
		defer d.gzip.Put(r)
		if err := r.Reset(bytes.NewReader(src)); err != nil {
			return nil, err
		}
		return d.readLimited(r, limit)
	case kgo.CodecLz4:
		r := d.lz4.Get().(*lz4.Reader)
		defer d.lz4.Put(r)
		r.Reset(bytes.NewReader(src))
		return d.readLimited(r, limit)
	case kgo.CodecZstd:
		v := d.zstd.Get()
		dec, ok := v.(*zstd.Decoder)
		if !ok {
			return nil, v.(error)
		}
		defer d.zstd.Put(dec)
		if err := dec.Reset(bytes.NewReader(src)); err != nil {
			return nil, err
		}
		out, err := d.readLimited(dec, limit)
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return nil, errOverLimit
		}
		return out, err
	default:
		return nil, fmt.Errorf("unknown compression codec %d", codec)
	}
}

// readLimited reads r whole into a fresh slice, or fails with errOverLimit
// once it yields more than limit bytes.
func (d *boundedDecompressor) readLimited(r io.Reader, limit int) ([]byte, error) {
	buf := d.bufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 1<<20 { // a bomb's buffer is not kept
			buf.Reset()
			d.bufs.Put(buf)
		}
	}()
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if n > int64(limit) {
		return nil, errOverLimit
	}
	return bytes.Clone(buf.Bytes()), nil
}

// xerialPrefix starts a snappy payload in the Java client's xerial framing:
// the magic, a version and a minimum version, then blocks of a big-endian
// length and a raw snappy block.
var xerialPrefix = []byte{130, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// decodeSnappy inflates raw or xerial-framed snappy, checking the lengths
// the blocks declare against limit before it allocates.
func decodeSnappy(src []byte, limit int) ([]byte, error) {
	if len(src) <= 16 || !bytes.HasPrefix(src, xerialPrefix) {
		n, err := s2.DecodedLen(src)
		if err != nil {
			return nil, err
		}
		if n > limit {
			return nil, errOverLimit
		}
		return s2.Decode(nil, src)
	}
	blocks := src[16:]
	total := 0
	for rem := blocks; len(rem) > 0; {
		if len(rem) < 4 {
			return nil, errors.New("snappy: malformed xerial framing")
		}
		size := binary.BigEndian.Uint32(rem)
		rem = rem[4:]
		if uint64(size) > uint64(len(rem)) {
			return nil, errors.New("snappy: malformed xerial framing")
		}
		n, err := s2.DecodedLen(rem[:size])
		if err != nil {
			return nil, err
		}
		if total += n; total > limit {
			return nil, errOverLimit
		}
		rem = rem[size:]
	}
	out := make([]byte, 0, total)
	for rem := blocks; len(rem) > 0; {
		size := binary.BigEndian.Uint32(rem)
		rem = rem[4:]
		n, _ := s2.DecodedLen(rem[:size])
		if _, err := s2.Decode(out[len(out):len(out)+n], rem[:size]); err != nil {
			return nil, err
		}
		out = out[:len(out)+n]
		rem = rem[size:]
	}
	return out, nil
}

func codecName(c kgo.CompressionCodecType) string {
	switch c {
	case kgo.CodecGzip:
		return "gzip"
	case kgo.CodecSnappy:
		return "snappy"
	case kgo.CodecLz4:
		return "lz4"
	case kgo.CodecZstd:
		return "zstd"
	}
	return "codec " + fmt.Sprint(int(c))
}

// undecompressableKey marks, in a kgo.Record's Context, a record that
// stands for an offset of a batch that inflates past its bound.
type undecompressableKey struct{}

// undecompressable returns the error of a record standing for an offset
// of a batch past the bound (see takeUndecompressable), or nil.
func undecompressable(r *kgo.Record) error {
	if r.Context == nil {
		return nil
	}
	err, _ := r.Context.Value(undecompressableKey{}).(error)
	return err
}

// takeUndecompressable turns each partition of fetches that franz-go
// stopped at a batch past the decompression bound into records standing
// for the batch's offsets, without key or value, that classify as bad
// input (ErrUndecompressable): decided, dead-lettered or halting, and
// committed like any other record, in offset order. The partition is then
// fetched again after them (skip).
//
// next reports where the partition's worker expects its next record, or
// false when this instance has no worker for it (the error is then left to
// fetchError: the partition's next owner meets the batch in turn). The
// records start there, not at the batch's first offset, and at most limit
// of them are made at a time, however many offsets the batch claims: a
// batch of more is met again at the next fetch, from where they ended.
func takeUndecompressable(fetches kgo.Fetches, batchMax, limit int, next func(string, int32) (int64, bool), skip func(string, int32, kgo.EpochOffset)) {
	for i := range fetches {
		for ti := range fetches[i].Topics {
			ft := &fetches[i].Topics[ti]
			for pi := range ft.Partitions {
				fp := &ft.Partitions[pi]
				tl, ok := errors.AsType[*kgo.ErrDecompressTooLarge](fp.Err)
				if !ok || len(fp.Records) > 0 {
					continue
				}
				from, ok := next(ft.Topic, fp.Partition)
				if !ok {
					continue
				}
				from = max(from, tl.Offset)
				to := min(tl.NextOffset, from+int64(limit))
				fp.Err = nil
				if from < to {
					cause := fmt.Errorf("%w: %s/%d: the record batch at offsets [%d, %d) inflates past pipeline.max_decompressed_batch_bytes (%d bytes); none of its records was read",
						ErrUndecompressable, tl.Topic, tl.Partition, tl.Offset, tl.NextOffset, batchMax)
					ctx := context.WithValue(context.Background(), undecompressableKey{}, cause)
					recs := make([]kgo.Record, to-from)
					fp.Records = make([]*kgo.Record, len(recs))
					for k := range recs {
						recs[k] = kgo.Record{Topic: ft.Topic, Partition: fp.Partition, Offset: from + int64(k), LeaderEpoch: tl.Epoch, Context: ctx}
						fp.Records[k] = &recs[k]
					}
				}
				skip(ft.Topic, fp.Partition, kgo.EpochOffset{Epoch: tl.Epoch, Offset: max(to, from)})
			}
		}
	}
}
