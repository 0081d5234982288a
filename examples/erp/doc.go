// Package erp is the invoice example's ERP: it receives the signed webhooks
// of completed extractions and finished uploads through webhook.Receiver,
// books each invoice once and closes each upload once.
//
// Two layers keep a booking single. The Receiver records the delivery id in
// llmq's inbox in the booking's transaction, so a redelivered webhook (same
// id) does nothing and still answers 2xx. The ERP's own key, (tenant,
// supplier, invoice number), makes a second delivery of the same invoice (a
// duplicate upload extracted twice) a receipt without a booking. Every
// delivery leaves a receipt, saying whether it booked.
//
// An upload's webhook (UploadEventType) closes the upload: one row per
// batch id, whatever delivered it and however often.
//
// SetDown simulates an outage: every request is answered 503 before it is
// read, so deliveries retry on llmq's schedule.
package erp
