"""Never ends: the wall limit must stop it."""
while True:
    pass
