package invoice

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strings"
)

// PolicyVersion names the validation rules below. It is part of every job's
// request hash and of every result, so a result says which rules passed it and
// a changed policy is a different request.
const PolicyVersion = "invoice-policy/v1"

// AllowedCurrencies are the currencies policy v1 accepts.
var allowedCurrencies = []string{"CHF", "EUR", "GBP", "USD"}

// Extraction is the schema the model is asked to fill. Amounts are decimal
// strings, so that nothing is rounded on the way in.
type Extraction struct {
	SupplierName  string            `json:"supplier_name"`
	InvoiceNumber string            `json:"invoice_number"`
	InvoiceDate   string            `json:"invoice_date"`
	Currency      string            `json:"currency"`
	IBAN          string            `json:"iban"`
	LineItems     []LineItem        `json:"line_items"`
	Subtotal      string            `json:"subtotal"`
	Tax           string            `json:"tax"`
	Total         string            `json:"total"`
	Evidence      map[string]string `json:"evidence"`
}

// LineItem is one line of an invoice.
type LineItem struct {
	Description string `json:"description"`
	Quantity    string `json:"quantity"`
	UnitPrice   string `json:"unit_price"`
	Amount      string `json:"amount"`
}

// Finding is one rule an extraction broke.
type Finding struct {
	Field string `json:"field"`
	Rule  string `json:"rule"`
	Issue string `json:"issue"`
}

// Result is a job's result: the extraction and what the policy found. A result
// with findings is REVIEW_REQUIRED and never reaches the ERP.
type Result struct {
	Policy     string     `json:"policy"`
	Extraction Extraction `json:"extraction"`
	Findings   []Finding  `json:"findings,omitempty"`
}

// errUnparsable is model output that is not the schema's JSON at all.
var errUnparsable = errors.New("model output is not an extraction")

// parseExtraction reads the model's content. Output that is not a JSON object
// of the schema's shape is an error (invalid output, retried); fields outside
// the schema are reported, not obeyed: model output is data, so a "send_to"
// that a document talked the model into is a finding for a person, never an
// instruction.
func parseExtraction(content string) (Extraction, []Finding, error) {
	var ex Extraction
	if err := json.Unmarshal([]byte(content), &ex); err != nil {
		return ex, nil, fmt.Errorf("%w: %w", errUnparsable, err)
	}
	var findings []Finding
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(content), &raw); err == nil {
		known := []string{"supplier_name", "invoice_number", "invoice_date", "currency", "iban", "line_items", "subtotal", "tax", "total", "evidence"}
		var extra []string
		for k := range raw {
			if !slices.Contains(known, k) {
				extra = append(extra, k)
			}
		}
		slices.Sort(extra)
		for _, k := range extra {
			findings = append(findings, Finding{Field: k, Rule: "schema", Issue: "field outside the schema; not acted on"})
		}
	}
	return ex, findings, nil
}

// Supplier is master data the policy checks an extraction against.
type Supplier struct {
	Name string
	IBAN string
}

var ibanRe = regexp.MustCompile(`^[A-Z]{2}\d{2}[A-Z0-9]{10,30}$`)

// check applies policy v1 to ex, given the document's OCR text and the
// supplier found under ex.SupplierName (nil if none). It never fills in or
// drops a field: a financial field the model could not support is a finding.
func check(ex *Extraction, ocr string, supplier *Supplier) []Finding {
	var f []Finding
	add := func(field, rule, format string, args ...any) {
		f = append(f, Finding{Field: field, Rule: rule, Issue: fmt.Sprintf(format, args...)})
	}

	// Schema: required fields and decimal amounts.
	for _, r := range []struct{ field, value string }{
		{"supplier_name", ex.SupplierName}, {"invoice_number", ex.InvoiceNumber},
		{"currency", ex.Currency}, {"iban", ex.IBAN}, {"subtotal", ex.Subtotal},
		{"tax", ex.Tax}, {"total", ex.Total},
	} {
		if strings.TrimSpace(r.value) == "" {
			add(r.field, "schema", "missing")
		}
	}
	if len(ex.LineItems) == 0 {
		add("line_items", "schema", "no line items")
	}
	money := func(field, s string) *big.Rat {
		if s == "" {
			return nil
		}
		r, ok := decimal(s, 2)
		if !ok {
			add(field, "schema", "%q is not an amount with at most two decimals", s)
			return nil
		}
		return r
	}
	subtotal, tax, total := money("subtotal", ex.Subtotal), money("tax", ex.Tax), money("total", ex.Total)

	// Arithmetic: each line, the lines against the subtotal, and the total.
	sum := new(big.Rat)
	linesOK := true
	for i, li := range ex.LineItems {
		field := fmt.Sprintf("line_items[%d]", i)
		q, okQ := decimal(li.Quantity, 4)
		p, okP := decimal(li.UnitPrice, 4)
		a := money(field+".amount", li.Amount)
		if !okQ || !okP || a == nil {
			add(field, "schema", "quantity, unit price and amount must be decimals")
			linesOK = false
			continue
		}
		if want := new(big.Rat).Mul(q, p); !sameCents(want, a) {
			add(field, "arithmetic", "%s x %s is %s, not %s", li.Quantity, li.UnitPrice, want.FloatString(2), li.Amount)
		}
		sum.Add(sum, a)
	}
	if linesOK && subtotal != nil && len(ex.LineItems) > 0 && !sameCents(sum, subtotal) {
		add("subtotal", "arithmetic", "line items add up to %s, not %s", sum.FloatString(2), ex.Subtotal)
	}
	if subtotal != nil && tax != nil && total != nil {
		if want := new(big.Rat).Add(subtotal, tax); !sameCents(want, total) {
			add("total", "arithmetic", "subtotal + tax is %s, not %s", want.FloatString(2), ex.Total)
		}
	}

	// Currencies.
	if ex.Currency != "" && !slices.Contains(allowedCurrencies, ex.Currency) {
		add("currency", "currency", "%q is not one of %s", ex.Currency, strings.Join(allowedCurrencies, ", "))
	}

	// Supplier master data.
	iban := strings.ReplaceAll(ex.IBAN, " ", "")
	if iban != "" && !ibanRe.MatchString(iban) {
		add("iban", "schema", "%q is not an IBAN", ex.IBAN)
	}
	switch {
	case ex.SupplierName == "":
	case supplier == nil:
		add("supplier_name", "supplier", "%q is not in the supplier master data", ex.SupplierName)
	case iban != "" && iban != supplier.IBAN:
		add("iban", "supplier", "does not match the IBAN on file for %q", supplier.Name)
	}

	// Evidence: every field must quote the document, and the quote must hold
	// the value. A value the document does not contain is not trusted,
	// however plausible.
	fields := []struct{ name, value string }{
		{"supplier_name", ex.SupplierName}, {"invoice_number", ex.InvoiceNumber},
		{"currency", ex.Currency}, {"iban", ex.IBAN}, {"subtotal", ex.Subtotal},
		{"tax", ex.Tax}, {"total", ex.Total},
	}
	for i, li := range ex.LineItems {
		fields = append(fields, struct{ name, value string }{fmt.Sprintf("line_items[%d]", i), li.Amount})
	}
	for _, fl := range fields {
		if fl.value == "" {
			continue
		}
		quote := ex.Evidence[fl.name]
		switch {
		case quote == "":
			add(fl.name, "evidence", "no evidence span")
		case !strings.Contains(ocr, quote):
			add(fl.name, "evidence", "evidence %q is not in the document", quote)
		case !strings.Contains(quote, fl.value):
			add(fl.name, "evidence", "evidence %q does not contain %q", quote, fl.value)
		}
	}
	return f
}

// decimal parses a plain decimal with at most places fractional digits.
func decimal(s string, places int) (*big.Rat, bool) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > places || strings.TrimLeft(whole+frac, "0123456789") != "" {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(s)
	return r, ok
}

// sameCents compares two amounts rounded to cents.
func sameCents(a, b *big.Rat) bool { return a.FloatString(2) == b.FloatString(2) }
