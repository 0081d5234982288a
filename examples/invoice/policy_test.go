package invoice

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

const ocr = `INVOICE
Supplier: Nordwind Papier GmbH
Invoice number: NW-1
Currency: EUR
IBAN: DE89370400440532013000
- Copy paper A4 | 2 x 4.50 = 9.00
- Toner black | 1 x 60.00 = 60.00
Subtotal: 69.00
Tax: 13.11
Total: 82.11
`

var nordwind = &Supplier{Name: "Nordwind Papier GmbH", IBAN: "DE89370400440532013000"}

func goodExtraction() Extraction {
	return Extraction{
		SupplierName: "Nordwind Papier GmbH", InvoiceNumber: "NW-1", Currency: "EUR", IBAN: "DE89370400440532013000",
		LineItems: []LineItem{
			{Description: "Copy paper A4", Quantity: "2", UnitPrice: "4.50", Amount: "9.00"},
			{Description: "Toner black", Quantity: "1", UnitPrice: "60.00", Amount: "60.00"},
		},
		Subtotal: "69.00", Tax: "13.11", Total: "82.11",
		Evidence: map[string]string{
			"supplier_name": "Supplier: Nordwind Papier GmbH", "invoice_number": "Invoice number: NW-1",
			"currency": "Currency: EUR", "iban": "IBAN: DE89370400440532013000",
			"line_items[0]": "- Copy paper A4 | 2 x 4.50 = 9.00", "line_items[1]": "- Toner black | 1 x 60.00 = 60.00",
			"subtotal": "Subtotal: 69.00", "tax": "Tax: 13.11", "total": "Total: 82.11",
		},
	}
}

// Each rule of the policy, on an extraction that breaks only it.
func TestPolicyRules(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		change   func(*Extraction)
		supplier *Supplier
		field    string
		rule     string
	}{
		{"line arithmetic", func(e *Extraction) { e.LineItems[0].Amount = "10.00"; e.Evidence["line_items[0]"] = "" }, nordwind, "line_items[0]", "arithmetic"},
		{"total", func(e *Extraction) { e.Total = "182.11"; e.Evidence["total"] = "Total: 182.11" }, nordwind, "total", "arithmetic"},
		{"currency", func(e *Extraction) { e.Currency = "XAU" }, nordwind, "currency", "currency"},
		{"unknown supplier", func(*Extraction) {}, nil, "supplier_name", "supplier"},
		{"iban not on file", func(e *Extraction) { e.IBAN = "GB33BUKB20201555555555" }, nordwind, "iban", "supplier"},
		{"evidence not in document", func(e *Extraction) { e.Evidence["tax"] = "Tax: 13.11 (approx.)" }, nordwind, "tax", "evidence"},
		{"evidence without the value", func(e *Extraction) { e.Evidence["invoice_number"] = "Currency: EUR" }, nordwind, "invoice_number", "evidence"},
		{"missing total is not nulled into success", func(e *Extraction) { e.Total = "" }, nordwind, "total", "schema"},
		{"not an amount", func(e *Extraction) { e.Tax = "13.1.1" }, nordwind, "tax", "schema"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ex := goodExtraction()
			tc.change(&ex)
			findings := check(&ex, ocr, tc.supplier)
			require.NotEmpty(t, findings)
			require.Contains(t, findings, findingFor(findings, tc.field, tc.rule), "%+v", findings)
			require.NotEmpty(t, findingFor(findings, tc.field, tc.rule).Issue)
		})
	}
	good := goodExtraction()
	require.Empty(t, check(&good, ocr, nordwind))
}

func findingFor(fs []Finding, field, rule string) Finding {
	for _, f := range fs {
		if f.Field == field && f.Rule == rule {
			return f
		}
	}
	return Finding{Field: field, Rule: rule}
}

// Fields outside the schema are findings, never instructions; output that
// is not JSON is an error (invalid output).
func TestParseExtraction(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(goodExtraction())
	require.NoError(t, err)
	_, findings, err := parseExtraction(string(b))
	require.NoError(t, err)
	require.Empty(t, findings)

	injected := `{"supplier_name":"x","send_to":"https://attacker.example/collect"}`
	_, findings, err = parseExtraction(injected)
	require.NoError(t, err)
	require.Equal(t, []Finding{{Field: "send_to", Rule: "schema", Issue: "field outside the schema; not acted on"}}, findings)

	_, _, err = parseExtraction(`{"supplier_name": "x", "line_items": [`)
	require.ErrorIs(t, err, errUnparsable)
}

func FuzzParseExtraction(f *testing.F) {
	b, err := json.Marshal(goodExtraction())
	require.NoError(f, err)
	f.Add(string(b))
	f.Add(`{"send_to":"x"}`)
	f.Add(`{"line_items":[{"quantity":"1e999"}]}`)
	f.Add(`[`)
	f.Fuzz(func(t *testing.T, content string) {
		ex, _, err := parseExtraction(content)
		if err != nil {
			return
		}
		_ = check(&ex, ocr, nordwind) // never panics, whatever the model said
	})
}

func FuzzDecimal(f *testing.F) {
	for _, s := range []string{"1", "1.5", "0.05", "12.345", "", ".", "1.", "-1", "1e3", "00.10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, ok := decimal(s, 2)
		if ok {
			require.NotNil(t, r)
			require.GreaterOrEqual(t, r.Sign(), 0)
		}
	})
}
