package serve

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

// Error codes of the JSON error body.
const (
	codeBadJSON      = "bad_json"       // the body is not the JSON the endpoint expects
	codeMissingField = "missing_field"  // a required field is absent
	codeBadField     = "bad_field"      // a field has an invalid value (bad hex, two exclusive fields)
	codeBadPayload   = "bad_payload"    // the payload does not hash: invalid JSON, too deep, too large
	codeTooLarge     = "body_too_large" // the body exceeds serve.max_body_bytes
	codeBodyTimeout  = "body_timeout"   // the body did not arrive within serve.request_timeout, or slower than the minimum rate
	codeOverloaded   = "overloaded"     // no room for the body (or the connection) in time: retry after Retry-After
	codeBatchTooLong = "batch_too_large"
	codeUnauthorized = "unauthorized"
	codeForbidden    = "forbidden"
	codeNotFound     = "not_found"
	codeUnavailable  = "unavailable" // the store: retry after Retry-After
	codeInternal     = "internal"
)

// unavailableMessage is the message of a check not decided for an outage.
const unavailableMessage = "store unavailable: no decision was made (or its outcome is unknown); retry"

// retryAfter is the Retry-After of a 503, in seconds.
const retryAfter = "1"

// errorBody is every error's JSON body.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":"internal","message":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	switch status {
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="dam"`)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", retryAfter)
	}
	writeJSON(w, status, errorBody{Code: code, Message: msg})
}

// apiError is an error answered with its status and code.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, msg: truncate(fmt.Sprintf(format, args...), maxMessage)}
}

// maxMessage bounds an error message: messages quote what the client sent
// (a member name, a service), which must not come back at any length.
const maxMessage = 512

// truncate cuts s to at most n bytes, on a character boundary, marking
// the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// checkRequest is one check: an identity and a payload. Entity and
// EntityHex, Payload and PayloadBase64 exclude each other.
type checkRequest struct {
	Service   *string `json:"service"`
	Entity    *string `json:"entity"`
	EntityHex *string `json:"entity_hex"`
	// Payload is any JSON value, hashed from its exact bytes in the body.
	Payload json.RawMessage `json:"payload"`
	// PayloadBase64 is the payload's bytes, for values that are not JSON
	// (format: bytes routes) or must be hashed byte for byte.
	PayloadBase64 *string `json:"payload_base64"`
}

// checkResponse is the answer to one check.
type checkResponse struct {
	Decision string `json:"decision"`
	Digest   string `json:"digest"`
}

// parse validates a check and hashes its payload. prefix names the check
// in messages ("checks[3].").
func (s *Server) parse(c *checkRequest, prefix string) (dedup.CheckItem, *apiError) {
	if c.Service == nil || *c.Service == "" {
		return dedup.CheckItem{}, badRequest(codeMissingField, "missing field %sservice", prefix)
	}
	if err := dedup.CheckService(*c.Service); err != nil {
		return dedup.CheckItem{}, identityError(prefix+"service", err)
	}
	if strings.ContainsRune(*c.Service, utf8.RuneError) {
		return dedup.CheckItem{}, badRequest(codeBadField, "%sservice: %s", prefix, replacementChar)
	}
	var entity []byte
	field := prefix + "entity"
	switch {
	case c.Entity != nil && c.EntityHex != nil:
		return dedup.CheckItem{}, badRequest(codeBadField, "%sentity and %sentity_hex exclude each other", prefix, prefix)
	case c.Entity != nil:
		if strings.ContainsRune(*c.Entity, utf8.RuneError) {
			return dedup.CheckItem{}, badRequest(codeBadField, "%s: %s; send an entity that is not UTF-8 text as entity_hex", field, replacementChar)
		}
		entity = []byte(*c.Entity)
	case c.EntityHex != nil:
		field += "_hex"
		b, err := hex.DecodeString(*c.EntityHex)
		if err != nil {
			return dedup.CheckItem{}, badRequest(codeBadField, "%s: not hex: %v", field, err)
		}
		entity = b
	default:
		return dedup.CheckItem{}, badRequest(codeMissingField, "missing field %sentity (or %sentity_hex)", prefix, prefix)
	}
	if err := dedup.CheckEntity(entity); err != nil {
		return dedup.CheckItem{}, identityError(field, err)
	}
	var value []byte
	switch {
	case c.Payload != nil && c.PayloadBase64 != nil:
		return dedup.CheckItem{}, badRequest(codeBadField, "%spayload and %spayload_base64 exclude each other", prefix, prefix)
	case c.Payload != nil:
		value = c.Payload
	case c.PayloadBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*c.PayloadBase64)
		if err != nil {
			return dedup.CheckItem{}, badRequest(codeBadField, "%spayload_base64: not base64: %v", prefix, err)
		}
		value = b
	default:
		return dedup.CheckItem{}, badRequest(codeMissingField, "missing field %spayload (or %spayload_base64)", prefix, prefix)
	}
	// (After the fields' own checks, so that a bad field is named as
	// such whatever the service.)
	if e := s.unknownService(prefix+"service", *c.Service); e != nil {
		return dedup.CheckItem{}, e
	}
	d, err := s.hasher(*c.Service).Sum(value)
	if err != nil {
		var ce *canon.Error
		if errors.As(err, &ce) {
			return dedup.CheckItem{}, badRequest(codeBadPayload, "%spayload: invalid JSON at byte %d: %s", prefix, ce.Offset, ce.Reason())
		}
		return dedup.CheckItem{}, badRequest(codeBadPayload, "%spayload: %v", prefix, err)
	}
	return dedup.CheckItem{Service: *c.Service, Entity: entity, Digest: d}, nil
}

// replacementChar is why an identity string holding U+FFFD is refused:
// the JSON decoder puts it in place of invalid UTF-8 and of a lone
// surrogate escape ("\ud800"), so distinct identities would arrive as one.
const replacementChar = "holds U+FFFD, which stands in the decoded string for invalid UTF-8 or a lone surrogate escape (distinct identities would be one)"

// identityError answers an identity the store cannot hold (dedup's
// identity limits, the sidecar's own): 400, naming the field. It is
// refused here, before the store, so that it never shares a transaction
// with other clients' checks.
func identityError(field string, err error) *apiError {
	reason := strings.TrimPrefix(err.Error(), dedup.ErrIdentity.Error()+": ")
	return badRequest(codeBadField, "%s: %s", field, reason)
}

// decode reads body (r's, through a bodyReader) as JSON into v,
// strictly (unknown fields are errors), within serve.max_body_bytes.
func (s *Server) decode(w http.ResponseWriter, body *bodyReader, v any) *apiError {
	limited := http.MaxBytesReader(w, io.NopCloser(body), int64(s.cfg.MaxBodyBytes))
	dec := json.NewDecoder(limited)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		err = bodyEnd(dec.Buffered(), limited)
	}
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, errNoRoom):
		s.metrics.overloaded.Inc()
		return &apiError{status: http.StatusServiceUnavailable, code: codeOverloaded,
			msg: fmt.Sprintf("too many request bodies of this token in flight (its share of serve.max_in_flight_bytes): no room within %s (serve.request_timeout); retry", s.cfg.RequestTimeout)}
	case errors.Is(err, errSlowBody):
		s.metrics.slowBodies.Inc()
		return &apiError{status: http.StatusRequestTimeout, code: codeBodyTimeout,
			msg: fmt.Sprintf("the request body arrives slower than %d bytes/s (after %s)", minBodyRate, bodyGrace)}
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.metrics.slowBodies.Inc()
		return &apiError{status: http.StatusRequestTimeout, code: codeBodyTimeout,
			msg: fmt.Sprintf("the request body did not arrive within %s (serve.request_timeout)", s.cfg.RequestTimeout)}
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return s.tooLarge()
	}
	if errors.Is(err, io.EOF) {
		return badRequest(codeBadJSON, "empty body: want a JSON object")
	}
	return badRequest(codeBadJSON, "invalid request body: %s", jsonProblem(err))
}

// errTrailingData is a body with more than whitespace after its JSON value.
var errTrailingData = errors.New("data after the JSON value")

// bodyEnd reads a body past its JSON value (buffered, what the decoder
// read beyond it, then the rest of body) to its end: nothing but
// whitespace may follow the value. It reads 512 bytes at a time, so that
// finding the end of a body sent chunked takes little room beside what it
// already holds (a read through the decoder takes a quarter of that), and
// it returns the read's own error (no room, a slow or late end, too
// large) as it is: a value whose end does not arrive is not one with
// data after it.
func bodyEnd(buffered, body io.Reader) error {
	buf := make([]byte, 512)
	for _, r := range []io.Reader{buffered, body} {
		for {
			n, err := r.Read(buf)
			if len(bytes.TrimLeft(buf[:n], " \t\r\n")) > 0 {
				return errTrailingData
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonProblem says what is wrong with a request body in the API's words:
// encoding/json's errors name dam's Go types ("Go struct field
// checkRequest.service of type string").
func jsonProblem(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return fmt.Sprintf("invalid JSON at byte %d: %s", syntax.Offset, syntax.Error())
	case errors.As(err, &typ):
		want := fmt.Sprintf("want %s, got %s (byte %d)", jsonKind(typ.Type), article(typ.Value), typ.Offset)
		if typ.Field == "" {
			return want
		}
		return typ.Field + ": " + want
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the body ends inside the JSON value"
	}
	// "json: unknown field \"x\"", and the decoder's other plain words.
	return strings.TrimPrefix(err.Error(), "json: ")
}

// jsonKind names the JSON value that decodes into t.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct:
		if t == reflect.TypeOf(checkRequest{}) || t == reflect.TypeOf(batchRequest{}) {
			return "a JSON object"
		}
		return "an object"
	case reflect.Map:
		return "an object"
	case reflect.Bool:
		return "a boolean"
	}
	return "a number"
}

// article puts "a" or "an" before the name of a JSON value's kind
// (encoding/json's UnmarshalTypeError.Value: "number", "object", "array",
// "string", "bool", ...).
func article(value string) string {
	switch {
	case value == "bool":
		return "a boolean"
	case strings.HasPrefix(value, "number"):
		return "a number"
	case value != "" && strings.ContainsRune("aeiou", rune(value[0])):
		return "an " + value
	}
	return "a " + value
}

// requestContext bounds a request's work by serve.request_timeout from
// now: the store's, and for a request with a body, reading it.
func (s *Server) requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
}

// tooLarge answers a body past serve.max_body_bytes.
func (s *Server) tooLarge() *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: codeTooLarge,
		msg: fmt.Sprintf("request body larger than %d bytes (serve.max_body_bytes)", s.cfg.MaxBodyBytes)}
}

// readBody reads r's body as JSON into v, taking room for it in t's
// share as it arrives (see room and bodyReader), within
// serve.request_timeout (waiting for room included) and at the minimum
// rate. It returns the context that bounds the rest of the request (the
// store: serve.request_timeout from the end of the body), and the
// function that gives the room back: call it once the body and what was
// decoded from it are no longer needed (once the payloads are hashed),
// whatever the error, then cancel.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, t *token, v any) (ctx context.Context, cancel context.CancelFunc, release func(), e *apiError) {
	none := func() {}
	limit := r.ContentLength
	if limit > int64(s.cfg.MaxBodyBytes) {
		return r.Context(), none, none, s.tooLarge() // refused unread
	}
	if limit < 0 { // not announced (chunked): as large as it may be, and the byte that tells it too large
		limit = int64(s.cfg.MaxBodyBytes) + 1
	}
	c := t.room.open(limit)
	release = sync.OnceFunc(func() { t.room.close(c) })
	bctx, bcancel := s.requestContext(r)
	deadline, _ := bctx.Deadline()
	body := &bodyReader{body: r.Body, room: t.room, claim: c, rc: http.NewResponseController(w),
		ctx: bctx, deadline: deadline, start: time.Now()}
	e = s.decode(w, body, v)
	bcancel()
	if body.eof {
		// No read deadline while the store decides: the request's context
		// bounds it, and a deadline passing would end that context.
		_ = body.rc.SetReadDeadline(time.Time{})
	} else {
		// Given up: no more of it is read (the server would read the rest
		// at the client's pace before closing).
		_ = body.rc.SetReadDeadline(aLongTimeAgo)
	}
	if e != nil {
		return r.Context(), none, release, e
	}
	ctx, cancel = s.requestContext(r)
	return ctx, cancel, release, nil
}

// statusClientGone is the status recorded for a request whose client went
// away before its answer (nginx's 499): nobody reads it.
const statusClientGone = 499

// clientGone reports whether err ended r's work because r's client went
// away: its context was canceled (the server's base context never is).
// That is not the store's failure.
func clientGone(r *http.Request, err error) bool {
	return errors.Is(err, context.Canceled) && r.Context().Err() != nil
}

// admit takes room for n checks in front of the store (see admission),
// or answers why not: 503 overloaded with Retry-After at once when the
// store is behind (its oldest queued work waited past maxStoreWait) or
// no room came within admitWait. Call the returned function (once or
// more) as soon as the store work is done, before writing the answer:
// a client that does not read its answer must not hold the room. r's
// connection is held until r's end (see connLimit.hold).
func (s *Server) admit(w http.ResponseWriter, r *http.Request, ctx context.Context, t *token, n int) (release func(), ok bool) {
	if cb := s.combiner.Load(); cb != nil {
		if behind := cb.oldest(); behind > maxStoreWait {
			s.metrics.shed.Inc()
			writeError(w, http.StatusServiceUnavailable, codeOverloaded,
				fmt.Sprintf("the store is behind: requests have waited %s for it (at most %s); nothing was decided; retry", behind.Round(time.Millisecond), maxStoreWait))
			return nil, false
		}
	}
	err := s.admission.acquire(ctx, t, n)
	switch {
	case err == nil:
		if !holdRequest(r) {
			// Closed for room as it was admitted: nobody reads an answer,
			// and nothing may be decided that nobody is told of.
			s.admission.release(t, n)
			writeError(w, http.StatusServiceUnavailable, codeOverloaded, "the connection was closed for room (serve.max_connections); nothing was decided; retry")
			return nil, false
		}
		return sync.OnceFunc(func() { s.admission.release(t, n) }), true
	case clientGone(r, err):
		w.WriteHeader(statusClientGone)
	default: // errShed, or the request's time ran out waiting
		s.metrics.shed.Inc()
		writeError(w, http.StatusServiceUnavailable, codeOverloaded,
			fmt.Sprintf("the store is at capacity: %d checks queued or being decided (serve.max_checks_in_flight); nothing was decided; retry", s.admission.limit))
	}
	return nil, false
}

// storeError answers a failed store call: 503 with Retry-After when the
// store is unavailable or the request ran out of time (no decision was
// made, or its outcome is unknown: never a guess), 500 otherwise. A
// request whose client went away is neither logged nor counted as a
// store error: nobody is there to answer.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, op string, err error) {
	if clientGone(r, err) {
		w.WriteHeader(statusClientGone)
		return
	}
	s.metrics.storeErrors.Inc()
	if isUnavailable(err) {
		s.log.Warn("serve: store unavailable", zap.String("op", op), zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, codeUnavailable, unavailableMessage)
		return
	}
	s.log.Error("serve: store error", zap.String("op", op), zap.Error(err))
	writeError(w, http.StatusInternalServerError, codeInternal, "store error")
}

// unauthorized answers a request without a valid token.
func unauthorized(w http.ResponseWriter) {
	writeError(w, http.StatusUnauthorized, codeUnauthorized, "missing or invalid bearer token")
}

// authorize checks that t allows every service, or answers 403.
func authorize(w http.ResponseWriter, t *token, services ...string) bool {
	for _, svc := range services {
		if !t.allows(svc) {
			writeError(w, http.StatusForbidden, codeForbidden, fmt.Sprintf("token not allowed service %q", truncate(svc, dedup.MaxServiceBytes)))
			return false
		}
	}
	return true
}

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	// Authenticate before reading the body: no work for a stranger.
	t := s.authenticate(r)
	if t == nil {
		unauthorized(w)
		return
	}
	var req checkRequest
	ctx, cancel, release, e := s.readBody(w, r, t, &req)
	defer cancel()
	defer release()
	if e != nil {
		writeError(w, e.status, e.code, e.msg)
		return
	}
	if req.Service != nil && !authorize(w, t, *req.Service) {
		return
	}
	c, e := s.parse(&req, "")
	release() // the body is hashed: its room is free for another
	if e != nil {
		writeError(w, e.status, e.code, e.msg)
		return
	}
	done, ok := s.admit(w, r, ctx, t, 1)
	if !ok {
		return
	}
	defer done()
	var d dedup.Decision
	var err error
	if cb := s.combiner.Load(); cb != nil {
		d, err = cb.check(ctx, c)
	} else {
		var out []dedup.Decision
		if out, err = s.store.CheckBatch(ctx, []dedup.CheckItem{c}, nil); err == nil {
			d = out[0]
		}
	}
	done()
	if err != nil {
		s.storeError(w, r, "check", err)
		return
	}
	s.metrics.decision(c.Service, d)
	writeJSON(w, http.StatusOK, checkResponse{Decision: d.String(), Digest: c.Digest.String()})
}

// batchRequest is the body of /v1/check:batch.
type batchRequest struct {
	Checks []checkRequest `json:"checks"`
}

// batchResult is one check's answer in a batch: a decision, or the error
// of that check alone.
type batchResult struct {
	Decision string     `json:"decision,omitempty"`
	Digest   string     `json:"digest,omitempty"`
	Error    *errorBody `json:"error,omitempty"`
}

type batchResponse struct {
	Results []batchResult `json:"results"`
}

// handleBatch decides a batch's valid checks in one transaction, in their
// order; an invalid check gets its own error and changes nothing.
func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	t := s.authenticate(r)
	if t == nil {
		unauthorized(w)
		return
	}
	var req batchRequest
	ctx, cancel, release, e := s.readBody(w, r, t, &req)
	defer cancel()
	defer release()
	if e != nil {
		writeError(w, e.status, e.code, e.msg)
		return
	}
	if req.Checks == nil {
		writeError(w, http.StatusBadRequest, codeMissingField, "missing field checks")
		return
	}
	if len(req.Checks) > s.cfg.MaxBatch {
		writeError(w, http.StatusRequestEntityTooLarge, codeBatchTooLong,
			fmt.Sprintf("%d checks: at most %d per batch (serve.max_batch)", len(req.Checks), s.cfg.MaxBatch))
		return
	}
	var services []string
	for _, c := range req.Checks {
		if c.Service != nil {
			services = append(services, *c.Service)
		}
	}
	if !authorize(w, t, services...) {
		return
	}
	results := make([]batchResult, len(req.Checks))
	items := make([]dedup.CheckItem, 0, len(req.Checks))
	index := make([]int, 0, len(req.Checks)) // items[k] answers checks[index[k]]
	for i := range req.Checks {
		c, e := s.parse(&req.Checks[i], "checks["+strconv.Itoa(i)+"].")
		if e != nil {
			results[i].Error = &errorBody{Code: e.code, Message: e.msg}
			continue
		}
		items = append(items, c)
		index = append(index, i)
	}
	req.Checks = nil
	release() // the payloads are hashed: their room is free for another
	if len(items) > 0 {
		done, ok := s.admit(w, r, ctx, t, len(items))
		if !ok {
			return
		}
		defer done()
		var decisions []dedup.Decision
		separated, down := false, error(nil)
		err := s.storeDo(ctx, func(ctx context.Context) error {
			var err error
			decisions, err = s.store.CheckBatch(ctx, items, nil)
			if err == nil || isUnavailable(err) || len(items) == 1 {
				return err
			}
			// The store refused the transaction for a reason no retry
			// fixes, perhaps because of one check: decide the checks one
			// by one, in order, so that only that check gets an error.
			s.metrics.storeErrors.Inc()
			s.log.Warn("serve: the store refused a batch; deciding its checks one by one", zap.Int("checks", len(items)), zap.Error(err))
			separated, down = true, s.checkSeparately(ctx, items, index, results)
			return nil
		})
		done()
		switch {
		case err != nil:
			s.storeError(w, r, "check batch", err)
			return
		case separated:
			if clientGone(r, down) {
				w.WriteHeader(statusClientGone)
				return
			}
		default:
			for k, d := range decisions {
				s.metrics.decision(items[k].Service, d)
				results[index[k]] = batchResult{Decision: d.String(), Digest: items[k].Digest.String()}
			}
		}
	}
	writeJSON(w, http.StatusOK, batchResponse{Results: results})
}

// storeDo runs fn, a request's store work other than a single check,
// with ctx: on a decider in its turn once Start started them (see
// combiner.do), so that it waits for PostgreSQL in the same queue as the
// checks, else at once.
func (s *Server) storeDo(ctx context.Context, fn func(context.Context) error) error {
	if cb := s.combiner.Load(); cb != nil {
		return cb.do(ctx, fn)
	}
	return fn(ctx)
}

// checkSeparately decides items one by one, each in a transaction of its
// own, writing each answer or error to results[index[k]]. After an outage
// the remaining checks are not tried: each says it was not decided. It
// returns the error of the outage, if any (the caller tells its client
// gone from the store down).
func (s *Server) checkSeparately(ctx context.Context, items []dedup.CheckItem, index []int, results []batchResult) error {
	var down error
	for k, it := range items {
		r := &results[index[k]]
		if down != nil {
			r.Error = &errorBody{Code: codeUnavailable, Message: unavailableMessage}
			continue
		}
		d, err := checkOne(ctx, s.store, it)
		switch {
		case err == nil:
			s.metrics.decision(it.Service, d)
			*r = batchResult{Decision: d.String(), Digest: it.Digest.String()}
		case isUnavailable(err):
			down = err
			r.Error = &errorBody{Code: codeUnavailable, Message: unavailableMessage}
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				continue // the client went away: not the store's failure
			}
			s.metrics.storeErrors.Inc()
			s.log.Warn("serve: store unavailable", zap.String("op", "check batch"), zap.Error(err))
		default:
			s.metrics.storeErrors.Inc()
			s.log.Error("serve: store error", zap.String("op", "check batch"), zap.Int("check", index[k]), zap.Error(err))
			r.Error = &errorBody{Code: codeInternal, Message: "store error"}
		}
	}
	return down
}

// stateResponse is an identity's stored state.
type stateResponse struct {
	Service   string    `json:"service"`
	Entity    string    `json:"entity"`
	EntityHex string    `json:"entity_hex"`
	Digest    string    `json:"digest"`
	UpdatedAt time.Time `json:"updated_at"`
	// Source is the input record that set the digest; absent when a check
	// (this service, or dedup.Check) set it.
	Source *source `json:"source,omitempty"`
}

type source struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// stateIdentity authenticates a state request, reads its identity and
// authorizes its service, or answers the failure.
func (s *Server) stateIdentity(w http.ResponseWriter, r *http.Request) (*token, string, []byte, bool) {
	t := s.authenticate(r)
	if t == nil {
		unauthorized(w)
		return nil, "", nil, false
	}
	service, entity, e := pathIdentity(r)
	if e == nil {
		e = s.unknownService("service", service)
	}
	if e != nil {
		writeError(w, e.status, e.code, e.msg)
		return nil, "", nil, false
	}
	if !authorize(w, t, service) {
		return nil, "", nil, false
	}
	return t, service, entity, true
}

// pathIdentity reads {service} and {entity}: path-escaped text, or hex
// with ?encoding=hex.
func pathIdentity(r *http.Request) (string, []byte, *apiError) {
	service, entity := r.PathValue("service"), []byte(r.PathValue("entity"))
	if err := dedup.CheckService(service); err != nil {
		return "", nil, identityError("service", err)
	}
	switch enc := r.URL.Query().Get("encoding"); enc {
	case "", "text":
	case "hex":
		b, err := hex.DecodeString(string(entity))
		if err != nil {
			return "", nil, badRequest(codeBadField, "entity: not hex: %v", err)
		}
		entity = b
	default:
		return "", nil, badRequest(codeBadField, "encoding %q: want text or hex", truncate(enc, 64))
	}
	if err := dedup.CheckEntity(entity); err != nil {
		return "", nil, identityError("entity", err)
	}
	return service, entity, nil
}

func (s *Server) handleStateGet(w http.ResponseWriter, r *http.Request) {
	t, service, entity, ok := s.stateIdentity(w, r)
	if !ok {
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	done, ok := s.admit(w, r, ctx, t, 1)
	if !ok {
		return
	}
	defer done()
	var st dedup.State
	err := s.storeDo(ctx, func(ctx context.Context) error {
		var err error
		st, err = s.store.Get(ctx, service, entity)
		return err
	})
	done()
	if errors.Is(err, dedup.ErrNotFound) {
		writeError(w, http.StatusNotFound, codeNotFound, "no state stored for this identity: its next check is forward")
		return
	}
	if err != nil {
		s.storeError(w, r, "get", err)
		return
	}
	resp := stateResponse{Service: st.Service, Entity: string(st.Entity), EntityHex: hex.EncodeToString(st.Entity),
		Digest: st.Digest.String(), UpdatedAt: st.UpdatedAt.UTC()}
	if st.Topic != "" {
		resp.Source = &source{Topic: st.Topic, Partition: st.Partition, Offset: st.Offset}
	}
	writeJSON(w, http.StatusOK, resp)
}

// resetResponse says whether a DELETE removed a stored state.
type resetResponse struct {
	Reset bool `json:"reset"`
}

func (s *Server) handleStateDelete(w http.ResponseWriter, r *http.Request) {
	t, service, entity, ok := s.stateIdentity(w, r)
	if !ok {
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	done, ok := s.admit(w, r, ctx, t, 1)
	if !ok {
		return
	}
	defer done()
	var n int64
	err := s.storeDo(ctx, func(ctx context.Context) error {
		var err error
		n, err = s.store.ResetEntities(ctx, service, [][]byte{entity})
		return err
	})
	done()
	if err != nil {
		s.storeError(w, r, "reset", err)
		return
	}
	s.log.Info("serve: state reset", zap.String("service", service), zap.String("entity_hex", hex.EncodeToString(entity)), zap.Bool("found", n > 0))
	writeJSON(w, http.StatusOK, resetResponse{Reset: n > 0})
}
