"""sdgruntime's own tests: they import sdgruntime and nothing of Shared Device Group
(api, controllers, webhooks), which test_packaging.py checks."""
