package pipeline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/twmb/franz-go/pkg/kgo"
)

// compress encodes src with codec as a Kafka producer would (xerial:
// snappy in the Java client's framing).
func compress(t testing.TB, codec string, src []byte) ([]byte, kgo.CompressionCodecType) {
	t.Helper()
	if codec == "xerial" {
		out := append(append([]byte{}, xerialPrefix...), 0, 0, 0, 1, 0, 0, 0, 1)
		for len(src) > 0 {
			n := min(len(src), 32<<10)
			block := s2.EncodeSnappy(nil, src[:n])
			out = binary.BigEndian.AppendUint32(out, uint32(len(block)))
			out = append(out, block...)
			src = src[n:]
		}
		return out, kgo.CodecSnappy
	}
	var c kgo.CompressionCodec
	switch codec {
	case "gzip":
		c = kgo.GzipCompression()
	case "snappy":
		c = kgo.SnappyCompression()
	case "lz4":
		c = kgo.Lz4Compression()
	case "zstd":
		c = kgo.ZstdCompression()
	}
	comp, err := kgo.DefaultCompressor(c)
	if err != nil {
		t.Fatal(err)
	}
	out, used := comp.Compress(new(bytes.Buffer), src)
	return bytes.Clone(out), used
}

var codecs = []string{"gzip", "snappy", "xerial", "lz4", "zstd"}

// A batch within the cap inflates to its bytes, whatever the codec; one
// past it is refused as ErrMaxDecompress (bad input), having inflated no
// more than the cap; once the batches since the last poll fill the window,
// the next is refused for now (errFetchWindowFull), until the poll.
func TestBoundedDecompressor(t *testing.T) {
	within := []byte(strings.Repeat(`{"id":"e-1","v":1}`, 3000)) // 54 KB
	bomb := make([]byte, 4<<20)                                  // 4 MiB of zeros
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			d := newBoundedDecompressor(1<<20, 3<<20)
			src, c := compress(t, codec, within)
			for i := range 3 * (3 << 20) / len(within) {
				got, err := d.Decompress(src, c)
				if errors.Is(err, errFetchWindowFull) {
					if i*len(within) < 2<<20 {
						t.Fatalf("window full after %d bytes of 3 MiB", i*len(within))
					}
					break
				}
				if err != nil || !bytes.Equal(got, within) {
					t.Fatalf("batch %d within the cap: %d bytes, %v", i, len(got), err)
				}
			}
			if _, err := d.Decompress(src, c); !errors.Is(err, errFetchWindowFull) {
				t.Fatalf("window past 3 MiB: err %v, want errFetchWindowFull", err)
			}
			d.polled()
			if got, err := d.Decompress(src, c); err != nil || len(got) != len(within) {
				t.Fatalf("after the poll: %d bytes, %v", len(got), err)
			}
			bsrc, bc := compress(t, codec, bomb)
			_, err := d.Decompress(bsrc, bc)
			if !errors.Is(err, kgo.ErrMaxDecompress) {
				t.Fatalf("a 4 MiB batch against a 1 MiB cap: %v, want ErrMaxDecompress", err)
			}
		})
	}
}

// Input that is not what its codec says fails cleanly, and uncompressed
// batches pass through untouched.
func TestBoundedDecompressorGarbage(t *testing.T) {
	d := newBoundedDecompressor(1<<20, 1<<20)
	for _, c := range []kgo.CompressionCodecType{kgo.CodecGzip, kgo.CodecSnappy, kgo.CodecLz4, kgo.CodecZstd, 7} {
		if _, err := d.Decompress([]byte("not compressed at all"), c); err == nil {
			t.Errorf("codec %d: garbage inflated without an error", c)
		}
	}
	src := []byte("plain")
	if got, err := d.Decompress(src, kgo.CodecNone); err != nil || &got[0] != &src[0] {
		t.Errorf("uncompressed: %q, %v; want the input itself", got, err)
	}
}

// FuzzBoundedDecompressor: whatever the bytes and the codec, the
// decompressor never panics and never returns more than its cap.
func FuzzBoundedDecompressor(f *testing.F) {
	for _, codec := range codecs {
		src, c := compress(f, codec, []byte(strings.Repeat("ab", 1000)))
		f.Add(src, int8(c))
		bomb, c := compress(f, codec, make([]byte, 1<<20))
		f.Add(bomb, int8(c))
	}
	f.Fuzz(func(t *testing.T, src []byte, codec int8) {
		d := newBoundedDecompressor(64<<10, 64<<10)
		out, err := d.Decompress(src, kgo.CompressionCodecType(codec&7))
		if err == nil && len(out) > 64<<10 {
			t.Fatalf("%d bytes out of a 64 KiB cap", len(out))
		}
	})
}
