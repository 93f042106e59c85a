"""Prefill/decode (and encode) disaggregation: role filters, the profile handlers that run a decode, an
optional encode and an optional prefill profile, the deciders that say when a request is worth
disaggregating, and the handlers that tell the decode pod's sidecar where its prefill/encode peers are."""
