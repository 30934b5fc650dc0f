"""The reference domain (SaaS support refunds): the example a catalog author copies.

One folder holds everything the domain is::

    models.py           tool arguments (validated) and the facts loaders give policies
    loaders.py          the resource each tool acts on, read in the caller's tenant
    handlers.py         what each tool does, in the executor's transaction; the refund's
                        external effect through the payment provider
    provider_client.py  the payment provider's HTTP client
    tools.py            the tools and the `Catalog` (``commands.payments.tools:catalog``)
    sql/                the named queries of loaders and handlers (tenant in every WHERE)
    policies/           the Cedar policies and their generated schema
    migrations/         the domain's tables and seed data, applied by `ratifier migrate`

Every query carries the tenant in its WHERE; absent and foreign resources look the same.
docs/catalog.md ("Starting from the reference domain") says how to copy it.
"""
