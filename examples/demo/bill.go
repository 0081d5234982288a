package main

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/llmq/llmq/examples/fakeprovider"
)

// bill is what the provider was paid for, by its own records of the calls
// it served (callLog), set against the documents the demo submitted: each
// distinct document paid for once, and a call more only where a fault made
// one necessary. The demo fails unless Paid = Distinct + FaultPaid.
type bill struct {
	Documents int // submitted
	// Distinct counts a tenant's bytes in a lane once, as an
	// extraction's reuse key does; Repeats are the rest: the same bytes
	// again, under another name and Idempotency-Key.
	Distinct, Repeats int
	// Reused counts the jobs that took a result instead of calling the
	// provider (their attempt is "reused").
	Reused int

	Calls int // every call the provider served, synchronous or in a batch
	Paid  int // of them answered 200 with usage: what the provider bills
	// The calls the faults caused, each followed by another: FaultPaid
	// were answered 200 with output that is not an extraction
	// (malformed), paid for and useless; the others were not answered,
	// so not billed: Refused (429), Failed (5xx or 4xx) and Unanswered
	// (hung until the client gave up, or given up on while generating).
	//
	// A call the fake never answered generated nothing and reported no
	// usage, so the fake's bill, which this is, is exact. A real
	// provider may bill such a call (an answer nobody read); llmq records
	// its attempt's usage as uncertain. Were they billed, the paid calls
	// would be Paid + Unanswered, which the summary shows too.
	FaultPaid, Refused, Failed, Unanswered int
	// InvalidOutput counts the attempts llmq recorded as ending with
	// invalid output: each is one of the provider's malformed answers,
	// so it must equal FaultPaid. It ties the provider's records to the
	// attempts.
	InvalidOutput int
	// PaidAgain names the documents whose useful answer was paid for
	// more than once; Strays counts useful answers to documents the demo
	// never submitted.
	PaidAgain []string
	Strays    int
}

// faultCalls is every call the faults caused, paid or not.
func (b bill) faultCalls() int { return b.FaultPaid + b.Refused + b.Failed + b.Unanswered }

// billOf sets the provider's calls against the documents submitted. A
// call's Document is the text the fake was sent, which is a document's
// bytes: the fake's own view of which document it answered.
func billOf(subs []*submission, calls []fakeprovider.Call) bill {
	type document struct {
		tenant, text string
		deferred     bool
	}
	b := bill{Documents: len(subs)}
	seen := map[document]bool{}
	want := map[string]int{} // useful answers each text needs: its distinct documents
	names := map[string]string{}
	for _, sub := range subs {
		d := document{sub.tenant, sub.text, sub.deferred}
		if seen[d] {
			continue
		}
		seen[d] = true
		want[sub.text]++
		names[sub.text] = sub.name
	}
	b.Distinct, b.Repeats = len(seen), len(subs)-len(seen)
	useful := map[string]int{}
	for _, c := range calls {
		b.Calls++
		switch {
		case c.Status == http.StatusOK && c.Fault == "malformed":
			b.Paid++
			b.FaultPaid++
		case c.Status == http.StatusOK:
			// Correct, or the plausible but wrong answer a review
			// document asks for: its document's one answer.
			b.Paid++
			useful[c.Document]++
		case c.Status == http.StatusTooManyRequests:
			b.Refused++
		case c.Status == 0:
			b.Unanswered++
		default:
			b.Failed++
		}
	}
	for text, n := range useful {
		switch {
		case want[text] == 0:
			b.Strays += n
		case n > want[text]:
			b.PaidAgain = append(b.PaidAgain, fmt.Sprintf("%s (%d answers for %d)", names[text], n, want[text]))
		}
	}
	slices.Sort(b.PaidAgain)
	return b
}

// check reports what breaks the bill's equation, through fail.
func (b bill) check(fail func(string, ...any)) {
	if b.Paid != b.Distinct+b.FaultPaid {
		fail("paid calls %d ≠ %d distinct documents + %d calls the faults caused; paid again: %v; answers to documents never submitted: %d",
			b.Paid, b.Distinct, b.FaultPaid, b.PaidAgain, b.Strays)
	}
	if b.InvalidOutput != b.FaultPaid {
		fail("the provider answered %d calls malformed, but %d attempts ended with invalid output", b.FaultPaid, b.InvalidOutput)
	}
	if b.Reused != b.Repeats {
		fail("%d jobs reused a result for %d repeated documents, want one each", b.Reused, b.Repeats)
	}
}

// String is the bill as the summary prints it.
func (b bill) String() string {
	rel := func(ok bool) string {
		if ok {
			return "="
		}
		return "≠"
	}
	unpaid := b.faultCalls() - b.FaultPaid
	return fmt.Sprintf("documents: %d submitted, %d distinct, %d repeated (the same bytes under another name and key); %d jobs reused a result\n", b.Documents, b.Distinct, b.Repeats, b.Reused) +
		fmt.Sprintf("provider calls (its own records): %d %s %d distinct documents + %d the faults caused (malformed %d, 429 %d, other errors %d, unanswered %d)\n",
			b.Calls, rel(b.Calls == b.Distinct+b.faultCalls()), b.Distinct, b.faultCalls(), b.FaultPaid, b.Refused, b.Failed, b.Unanswered) +
		fmt.Sprintf("paid calls: %d %s %d distinct documents + %d the faults caused (malformed answers, paid and retried); the faults' %d other calls were refused, failed or unanswered, none billed (%d paid if the %d unanswered were)\n",
			b.Paid, rel(b.Paid == b.Distinct+b.FaultPaid), b.Distinct, b.FaultPaid, unpaid, b.Paid+b.Unanswered, b.Unanswered)
}
