"""toFQDNs: DNS messages (:mod:`.dns`), the DNS cache (:mod:`.cache`), the agent's DNS proxy
(:mod:`.proxy`) and the lab zone's DNS server in ext (:mod:`.zone`)."""
