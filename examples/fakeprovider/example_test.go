package fakeprovider_test

import (
	"fmt"

	"github.com/llmq/llmq/examples/fakeprovider"
)

// The fake model reads the example's invoice layout and quotes its evidence.
func ExampleExtract() {
	ex := fakeprovider.Extract("Supplier: Nordwind Papier GmbH\nIBAN: DE89370400440532013000\n- Paper | 2 x 4.50 = 9.00\nTotal: 10.71\n")
	fmt.Println(ex.SupplierName, ex.IBAN, ex.Total, len(ex.LineItems))
	fmt.Println(ex.Evidence["total"])
	// Output:
	// Nordwind Papier GmbH DE89370400440532013000 10.71 1
	// Total: 10.71
}
