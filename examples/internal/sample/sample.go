// Package sample writes the OCR text of plausible supplier invoices, for the
// demo and the acceptance suite: line items, tax and total that add up, and
// the supplier's name and IBAN as the master data has them.
//
// It is under examples/internal, which a program outside this module
// cannot import: a service copying an example copies this package with it
// (it imports only public packages; TestExamplesImportOnlyWhatAHostCan in
// the module's root checks that every example does too).
package sample

import (
	"fmt"
	"strings"

	"github.com/llmq/llmq/examples/invoice"
)

// Invoice is the OCR text of invoice n of sup, numbered number, with extra
// appended on its own line (a fault marker the fake provider reads, or an
// injection attempt). n varies the quantities and the date.
func Invoice(sup invoice.Supplier, number string, n int, extra string) string {
	q1, q2 := n%7+1, n%3+1
	a1, a2 := q1*450, q2*6000 // cents
	sub := a1 + a2
	tax := (sub*19 + 50) / 100
	var b strings.Builder
	b.WriteString("INVOICE\n")
	fmt.Fprintf(&b, "Supplier: %s\n", sup.Name)
	fmt.Fprintf(&b, "Invoice number: %s\n", number)
	fmt.Fprintf(&b, "Date: 2026-11-%02d\n", n%28+1)
	b.WriteString("Currency: EUR\n")
	fmt.Fprintf(&b, "IBAN: %s\n", sup.IBAN)
	b.WriteString("Items:\n")
	fmt.Fprintf(&b, "- Copy paper A4 | %d x 4.50 = %s\n", q1, cents(a1))
	fmt.Fprintf(&b, "- Toner black | %d x 60.00 = %s\n", q2, cents(a2))
	fmt.Fprintf(&b, "Subtotal: %s\n", cents(sub))
	fmt.Fprintf(&b, "Tax: %s\n", cents(tax))
	fmt.Fprintf(&b, "Total: %s\n", cents(sub+tax))
	if extra != "" {
		b.WriteString(extra + "\n")
	}
	return b.String()
}

func cents(c int) string { return fmt.Sprintf("%d.%02d", c/100, c%100) }
