"""WebShop for envhub: the shop offline, synthetic goals, upstream's reward, a text env and a web page."""
