// Command demo runs the invoice pipeline end to end in one process.
package main

func main() {}
