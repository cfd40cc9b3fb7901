package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/canon"
)

func newHashCmd() *cobra.Command {
	var (
		ignore  []string
		format  string
		lines   bool
		explain bool
	)
	cmd := &cobra.Command{
		Use:   "hash [--ignore PTR]... [--format json|bytes] [--lines] [--explain] [FILE]",
		Short: "Print the structural hash of a record value",
		Long: `Print the digest dam stores for a record value read from FILE (default
stdin): the hash scheme byte and the SHA-256 sum, in hex. Two values get the
same digest iff dam treats them as duplicates: member order, whitespace and
string escapes do not matter, number text does, and values at --ignore
pointers are left out.

With --lines, every non-blank line is a value and gets its own digest, in
order. With --explain, print the canonical form that is hashed instead.

Invalid input exits with status 1 and names the byte (and line) at fault.`,
		Example: `  echo '{"b":1,"a":2}' | dam hash
  dam hash --ignore /updated_at --ignore '/items/*/ts' record.json
  kcat -C -t projections -e -f '%s\n' | dam hash --lines`,
		Args:                  argsUsage(cobra.MaximumNArgs(1)),
		DisableFlagsInUseLine: true, // Use already lists them
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := canon.ParseFormat(format)
			if err != nil {
				return usagef("--format: %v", err)
			}
			h, err := canon.New(canon.WithIgnore(ignore...), canon.WithFormat(f))
			if err != nil {
				return usagef("--ignore: %v", err)
			}
			in := cmd.InOrStdin()
			if len(args) == 1 && args[0] != "-" {
				file, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer file.Close()
				in = file
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			defer out.Flush()
			hc := hashCmd{h: h, explain: explain, out: out, stderr: cmd.ErrOrStderr()}
			if lines {
				return hc.lines(in)
			}
			return hc.whole(in)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&ignore, "ignore", nil, "JSON pointer (RFC 6901, * matches any member or index) to leave out of the hash; repeatable")
	fl.StringVar(&format, "format", "json", "value format: json (structural hash) or bytes (hash of the raw bytes)")
	fl.BoolVar(&lines, "lines", false, "read newline-delimited values and print one digest per line")
	fl.BoolVar(&explain, "explain", false, "print the canonical form that is hashed instead of the digest")
	return cmd
}

type hashCmd struct {
	h       *canon.Hasher
	explain bool
	out     *bufio.Writer
	stderr  io.Writer
}

// maxSize is the input size the hasher accepts (its default).
const maxSize = canon.DefaultMaxSize

// whole hashes all of in as one value.
func (c hashCmd) whole(in io.Reader) error {
	// Read one byte past the limit so that a larger input is reported as
	// too large without holding all of it.
	value, err := io.ReadAll(io.LimitReader(in, maxSize+1))
	if err != nil {
		return err
	}
	if value == nil {
		value = []byte{} // empty input is an (invalid or empty-bytes) value, not a tombstone
	}
	if err := c.one(value); err != nil {
		return c.invalid(err, 0)
	}
	return nil
}

// lines hashes every non-blank line of in.
func (c hashCmd) lines(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), maxSize+1)
	line := 0
	for sc.Scan() {
		line++
		value := sc.Bytes()
		if len(bytes.Trim(value, " \t\r\n")) == 0 {
			continue
		}
		if err := c.one(value); err != nil {
			return c.invalid(err, line)
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return c.invalid(&canon.Error{Offset: maxSize, Err: canon.ErrTooLarge, Detail: fmt.Sprintf("line longer than %d bytes", maxSize)}, line+1)
	} else if err != nil {
		return err
	}
	return nil
}

func (c hashCmd) one(value []byte) error {
	if c.explain {
		text, err := c.h.AppendCanonical(nil, value)
		if err != nil {
			return err
		}
		if c.h.Format() == canon.FormatBytes {
			text = append(text, '\n')
		}
		_, err = c.out.Write(text)
		return err
	}
	d, err := c.h.Sum(value)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, d)
	return err
}

// invalid reports invalid input (exit status 1, no usage); other errors
// pass through. line is 0 without --lines.
func (c hashCmd) invalid(err error, line int) error {
	var e *canon.Error
	if !errors.As(err, &e) {
		return err
	}
	c.out.Flush() // the digests of the lines before come first
	if line > 0 {
		fmt.Fprintf(c.stderr, "dam: invalid JSON at line %d, byte %d: %s\n", line, e.Offset, e.Reason())
	} else {
		fmt.Fprintf(c.stderr, "dam: invalid JSON at byte %d: %s\n", e.Offset, e.Reason())
	}
	return exitStatus(1)
}
