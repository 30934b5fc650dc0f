"""Adapters from agent frameworks to ratifier: each turns the catalog's exported tool
definitions into the framework's tools, publishes every invocation through
`ratifier_client.RatifierClient`, and maps ratifier's ``awaiting_approval`` to the framework's
own human-in-the-loop mechanism. They import the client and the contract (`schemas`) only;
each framework is imported by its own module, so using one never requires the others."""
